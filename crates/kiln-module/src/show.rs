//! Pieces of messages and printed forms that the crates above share (the compiler's
//! shape inference and printer, the runtime's errors).

use core::fmt;

/// Writes `items` one after another with `sep` between them and nothing around them:
/// `[2, 3]` with `","` is `2,3`, an empty list nothing.
pub fn write_joined<T: fmt::Display>(
    f: &mut fmt::Formatter<'_>,
    items: impl IntoIterator<Item = T>,
    sep: &str,
) -> fmt::Result {
    for (i, item) in items.into_iter().enumerate() {
        if i > 0 {
            f.write_str(sep)?;
        }
        write!(f, "{item}")?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::string::ToString;

    struct List<'a>(&'a [i64], &'a str);

    impl fmt::Display for List<'_> {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            write_joined(f, self.0, self.1)
        }
    }

    #[test]
    fn separators_stand_between_items_only() {
        assert_eq!(List(&[], ", ").to_string(), "");
        assert_eq!(List(&[7], ", ").to_string(), "7");
        assert_eq!(List(&[2, -3, 4], ", ").to_string(), "2, -3, 4");
        assert_eq!(List(&[1, 3, 224], "x").to_string(), "1x3x224");
    }
}
