//! Static shapes and tensor types.

use crate::dtype::DType;
use core::fmt;
use kiln_module::show::write_joined;

/// The highest rank kiln accepts.
pub const MAX_RANK: usize = 8;

/// A static shape: rank 0 to [`MAX_RANK`], every dimension a known extent (0 allowed).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Default)]
pub struct Shape(Vec<usize>);

/// Error building a [`Shape`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ShapeError {
    /// More than [`MAX_RANK`] dimensions.
    #[error("rank {0} exceeds the maximum rank {MAX_RANK}")]
    RankTooHigh(usize),
    /// The element count overflows `usize` (or exceeds the 2^48 elements kiln allows).
    #[error("shape {0:?} has too many elements")]
    TooLarge(Vec<usize>),
}

/// The largest element count any tensor may have (keeps byte sizes far from overflow).
pub const MAX_ELEMENTS: usize = 1 << 48;

impl Shape {
    /// A shape from its dimensions; fails above [`MAX_RANK`] or when the element count is absurd.
    pub fn new(dims: impl Into<Vec<usize>>) -> Result<Shape, ShapeError> {
        let dims = dims.into();
        if dims.len() > MAX_RANK {
            return Err(ShapeError::RankTooHigh(dims.len()));
        }
        let mut n: usize = 1;
        for &d in &dims {
            n = n.checked_mul(d).ok_or_else(|| ShapeError::TooLarge(dims.clone()))?;
        }
        if n > MAX_ELEMENTS || dims.iter().any(|&d| d > MAX_ELEMENTS) {
            return Err(ShapeError::TooLarge(dims));
        }
        Ok(Shape(dims))
    }

    /// The rank-0 shape.
    pub fn scalar() -> Shape {
        Shape(Vec::new())
    }

    /// Dimensions.
    pub fn dims(&self) -> &[usize] {
        &self.0
    }

    /// Rank.
    pub fn rank(&self) -> usize {
        self.0.len()
    }

    /// Number of elements (1 for a scalar).
    pub fn numel(&self) -> usize {
        self.0.iter().product()
    }

    /// Row-major strides in elements.
    pub fn strides(&self) -> Vec<usize> {
        let mut s = vec![1; self.0.len()];
        for i in (0..self.0.len().saturating_sub(1)).rev() {
            s[i] = s[i + 1] * self.0[i + 1];
        }
        s
    }
}

impl fmt::Display for Shape {
    /// `1x3x224x224`; a scalar prints as the empty string.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_joined(f, &self.0, "x")
    }
}

/// A dtype with a static shape.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TensorType {
    /// Element type.
    pub dtype: DType,
    /// Shape.
    pub shape: Shape,
}

impl TensorType {
    /// A tensor type.
    pub fn new(dtype: DType, shape: Shape) -> TensorType {
        TensorType { dtype, shape }
    }

    /// Bytes of storage.
    pub fn storage_bytes(&self) -> usize {
        self.dtype.storage_bytes(self.shape.numel())
    }
}

impl fmt::Display for TensorType {
    /// `f32[1,3,224,224]`, `i64[]` for a scalar.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}[", self.dtype)?;
        write_joined(f, self.shape.dims(), ",")?;
        f.write_str("]")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn basics() {
        let s = Shape::new(vec![2, 3, 4]).unwrap();
        assert_eq!(s.numel(), 24);
        assert_eq!(s.strides(), vec![12, 4, 1]);
        assert_eq!(Shape::scalar().numel(), 1);
        assert!(Shape::new(vec![1; 9]).is_err());
        assert!(Shape::new(vec![usize::MAX, 2]).is_err());
        let t = TensorType::new(DType::F32, s);
        assert_eq!(t.to_string(), "f32[2,3,4]");
    }
}

/// The dims of a reduction of `dims` over the axes flagged in `red`: a reduced axis
/// stays as 1 with `keep` and goes without. Shape inference, the lowering and the
/// reference evaluator all shape reductions with it.
pub fn reduced_dims(dims: &[usize], red: &[bool], keep: bool) -> Vec<usize> {
    dims.iter()
        .zip(red)
        .filter_map(|(&n, &r)| match (r, keep) {
            (false, _) => Some(n),
            (true, true) => Some(1),
            (true, false) => None,
        })
        .collect()
}
