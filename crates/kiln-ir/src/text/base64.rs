//! Standard base64 (RFC 4648 alphabet, `=` padding) for the `blobs` section.

const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/// Encodes `data`, padding the last group with `=`.
pub fn encode(data: &[u8]) -> String {
    let mut out = String::with_capacity(data.len().div_ceil(3) * 4);
    for chunk in data.chunks(3) {
        let b = [chunk[0], chunk.get(1).copied().unwrap_or(0), chunk.get(2).copied().unwrap_or(0)];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        let sextet = |shift: u32| char::from(ALPHABET[((n >> shift) & 63) as usize]);
        out.push(sextet(18));
        out.push(sextet(12));
        out.push(if chunk.len() > 1 { sextet(6) } else { '=' });
        out.push(if chunk.len() > 2 { sextet(0) } else { '=' });
    }
    out
}

fn sextet(c: u8) -> Option<u32> {
    Some(u32::from(match c {
        b'A'..=b'Z' => c - b'A',
        b'a'..=b'z' => c - b'a' + 26,
        b'0'..=b'9' => c - b'0' + 52,
        b'+' => 62,
        b'/' => 63,
        _ => return None,
    }))
}

/// Why a base64 text does not decode; `offset` is the byte offset in the text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecodeError {
    /// Offset of the offending character (or of the incomplete group).
    pub offset: usize,
    /// What is wrong.
    pub message: String,
}

/// Decodes one piece of base64 text, appending to `out`. The text must be whole groups of
/// four characters; `=` padding may end it, and the bits padding drops must be zero (so
/// every byte string has exactly one encoding). Returns whether the text ended in padding.
pub fn decode_into(text: &str, out: &mut Vec<u8>) -> Result<bool, DecodeError> {
    let t = text.as_bytes();
    if !t.len().is_multiple_of(4) {
        return Err(DecodeError {
            offset: t.len() - t.len() % 4,
            message: format!("base64 text has {} characters, not a multiple of 4", t.len()),
        });
    }
    let groups = t.len() / 4;
    for (g, quad) in t.chunks_exact(4).enumerate() {
        let last = g + 1 == groups;
        let pad = quad.iter().rev().take_while(|&&c| c == b'=').count();
        if pad > 2 || (pad > 0 && !last) {
            let first_pad = quad.iter().position(|&c| c == b'=').unwrap_or(0);
            return Err(DecodeError { offset: g * 4 + first_pad, message: "misplaced base64 padding `=`".to_string() });
        }
        let mut n = 0u32;
        for (k, &c) in quad[..4 - pad].iter().enumerate() {
            let v = sextet(c).ok_or_else(|| DecodeError {
                offset: g * 4 + k,
                message: if c == b'=' {
                    "misplaced base64 padding `=`".to_string()
                } else {
                    format!("invalid base64 character {:?}", char::from(c))
                },
            })?;
            n |= v << (18 - 6 * k);
        }
        let bytes = [(n >> 16) as u8, (n >> 8) as u8, n as u8];
        let keep = 3 - pad;
        if bytes[keep..].iter().any(|&b| b != 0) {
            return Err(DecodeError {
                offset: g * 4 + 3 - pad,
                message: "base64 group has non-zero bits after its last byte".to_string(),
            });
        }
        out.extend_from_slice(&bytes[..keep]);
        if last {
            return Ok(pad > 0);
        }
    }
    Ok(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode(s: &str) -> Result<Vec<u8>, DecodeError> {
        let mut v = Vec::new();
        decode_into(s, &mut v).map(|_| v)
    }

    #[test]
    fn rfc4648_vectors() {
        // The test vectors of RFC 4648, section 10.
        let cases = [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("fooba", "Zm9vYmE="),
            ("foobar", "Zm9vYmFy"),
        ];
        for (plain, coded) in cases {
            assert_eq!(encode(plain.as_bytes()), coded);
            assert_eq!(decode(coded).unwrap(), plain.as_bytes());
        }
    }

    #[test]
    fn all_bytes_round_trip() {
        let data: Vec<u8> = (0..=255u8).chain((0..=255u8).rev()).collect();
        for len in 0..data.len() {
            assert_eq!(decode(&encode(&data[..len])).unwrap(), &data[..len]);
        }
        // 0xFB 0xFF: sextets 62 and 63 appear.
        assert_eq!(encode(&[0xFB, 0xFF, 0xBF]), "+/+/");
    }

    #[test]
    fn rejects_malformed() {
        assert_eq!(decode("Zm9").unwrap_err().offset, 0);
        assert_eq!(decode("Zm!v").unwrap_err().offset, 2);
        assert_eq!(decode("Zg==Zm9v").unwrap_err().offset, 2);
        assert_eq!(decode("Z===").unwrap_err().offset, 1);
        // "Zh==": 'h' leaves non-zero bits after the single byte.
        assert!(decode("Zh==").is_err());
    }
}
