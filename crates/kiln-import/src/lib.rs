//! kiln's model importers. (Being written.)
