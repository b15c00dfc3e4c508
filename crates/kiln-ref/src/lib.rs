//! kiln's reference evaluator. (Being written.)
