//! The text form of the tensor level. (Being written.)
