//! Tokens of the text form.

use core::fmt;

/// One token.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Tok {
    /// `[A-Za-z_][A-Za-z0-9_.]*`: keywords, op names, dtypes, attribute names.
    Ident(String),
    /// `%N`.
    Value(u32),
    /// A number as written: `-`? then a digit, then letters, digits, `.`, and a sign
    /// right after an exponent `e`/`E` (hex numbers `0x…` take no sign).
    Num(String),
    /// A string literal, escapes resolved.
    Str(String),
    /// `-` not followed by a digit or `>` (as in `-inf`).
    Minus,
    Arrow,
    At,
    LParen,
    RParen,
    LBrack,
    RBrack,
    LBrace,
    RBrace,
    Comma,
    Colon,
    Eq,
    Eof,
}

impl fmt::Display for Tok {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Tok::Ident(s) => write!(f, "`{s}`"),
            Tok::Value(v) => write!(f, "`%{v}`"),
            Tok::Num(s) => write!(f, "`{s}`"),
            Tok::Str(s) if s.chars().count() > 24 => {
                write!(f, "string \"{}…\"", s.chars().take(24).collect::<String>().escape_debug())
            }
            Tok::Str(s) => write!(f, "string \"{}\"", s.escape_debug()),
            Tok::Minus => f.write_str("`-`"),
            Tok::Arrow => f.write_str("`->`"),
            Tok::At => f.write_str("`@`"),
            Tok::LParen => f.write_str("`(`"),
            Tok::RParen => f.write_str("`)`"),
            Tok::LBrack => f.write_str("`[`"),
            Tok::RBrack => f.write_str("`]`"),
            Tok::LBrace => f.write_str("`{`"),
            Tok::RBrace => f.write_str("`}`"),
            Tok::Comma => f.write_str("`,`"),
            Tok::Colon => f.write_str("`:`"),
            Tok::Eq => f.write_str("`=`"),
            Tok::Eof => f.write_str("end of input"),
        }
    }
}

/// A lexing error at a byte offset.
#[derive(Debug)]
pub(crate) struct LexError {
    pub pos: usize,
    pub message: String,
}

fn err<T>(pos: usize, message: impl Into<String>) -> Result<T, LexError> {
    Err(LexError { pos, message: message.into() })
}

fn is_ident_start(c: u8) -> bool {
    c.is_ascii_alphabetic() || c == b'_'
}

fn is_ident_char(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_' || c == b'.'
}

/// True if `s` can be written as a bare identifier (else it is quoted).
pub(crate) fn is_ident(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty() && is_ident_start(b[0]) && b[1..].iter().all(|&c| is_ident_char(c))
}

/// Splits `src` into tokens with their byte offsets. The last token is [`Tok::Eof`]: at the
/// end of the text, or where the first lexing error (also returned) stops the scan, so
/// that the parser can report whichever error comes first in the text.
pub(crate) fn lex(src: &str) -> (Vec<(Tok, usize)>, Option<LexError>) {
    let mut toks = Vec::new();
    match lex_into(src, &mut toks) {
        Ok(()) => {
            toks.push((Tok::Eof, src.len()));
            (toks, None)
        }
        Err(e) => {
            toks.push((Tok::Eof, e.pos));
            (toks, Some(e))
        }
    }
}

fn lex_into(src: &str, toks: &mut Vec<(Tok, usize)>) -> Result<(), LexError> {
    let b = src.as_bytes();
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        let start = i;
        let single = match c {
            b' ' | b'\t' | b'\n' | b'\r' => {
                i += 1;
                continue;
            }
            b'/' if b.get(i + 1) == Some(&b'/') => {
                while i < b.len() && b[i] != b'\n' {
                    i += 1;
                }
                continue;
            }
            b'@' => Some(Tok::At),
            b'(' => Some(Tok::LParen),
            b')' => Some(Tok::RParen),
            b'[' => Some(Tok::LBrack),
            b']' => Some(Tok::RBrack),
            b'{' => Some(Tok::LBrace),
            b'}' => Some(Tok::RBrace),
            b',' => Some(Tok::Comma),
            b':' => Some(Tok::Colon),
            b'=' => Some(Tok::Eq),
            _ => None,
        };
        if let Some(t) = single {
            toks.push((t, start));
            i += 1;
            continue;
        }
        if c == b'-' && b.get(i + 1) == Some(&b'>') {
            toks.push((Tok::Arrow, start));
            i += 2;
        } else if c == b'-' && !b.get(i + 1).is_some_and(u8::is_ascii_digit) {
            toks.push((Tok::Minus, start));
            i += 1;
        } else if c == b'-' || c.is_ascii_digit() {
            i += usize::from(c == b'-');
            let hex = b[i] == b'0' && matches!(b.get(i + 1), Some(b'x' | b'X'));
            while i < b.len() {
                let d = b[i];
                let exp_sign =
                    !hex && (d == b'+' || d == b'-') && i > start && matches!(b[i - 1], b'e' | b'E');
                if d.is_ascii_alphanumeric() || d == b'_' || (d == b'.' && !hex) || exp_sign {
                    i += 1;
                } else {
                    break;
                }
            }
            toks.push((Tok::Num(src[start..i].to_string()), start));
        } else if c == b'%' {
            i += 1;
            let digits = i;
            while i < b.len() && b[i].is_ascii_digit() {
                i += 1;
            }
            if i == digits {
                return err(start, "expected a value number after `%`");
            }
            let n: u32 = src[digits..i].parse().map_err(|_| LexError {
                pos: start,
                message: format!("value number `%{}` is too large", &src[digits..i]),
            })?;
            toks.push((Tok::Value(n), start));
        } else if is_ident_start(c) {
            while i < b.len() && is_ident_char(b[i]) {
                i += 1;
            }
            toks.push((Tok::Ident(src[start..i].to_string()), start));
        } else if c == b'"' {
            let (s, end) = string(src, i)?;
            toks.push((Tok::Str(s), start));
            i = end;
        } else {
            let ch = src[i..].chars().next().unwrap_or('?');
            return err(start, format!("unexpected character {ch:?}"));
        }
    }
    Ok(())
}

/// Reads the string literal starting at `b[start] == '"'`; returns it and the offset after it.
fn string(src: &str, start: usize) -> Result<(String, usize), LexError> {
    let mut out = String::new();
    let mut it = src[start + 1..].char_indices().map(|(k, c)| (start + 1 + k, c)).peekable();
    while let Some((pos, c)) = it.next() {
        match c {
            '"' => return Ok((out, pos + 1)),
            '\n' | '\r' => return err(start, "unterminated string (strings end on their line)"),
            '\\' => {
                let Some((_, e)) = it.next() else { break };
                match e {
                    '"' => out.push('"'),
                    '\\' => out.push('\\'),
                    'n' => out.push('\n'),
                    't' => out.push('\t'),
                    'r' => out.push('\r'),
                    'u' => {
                        if it.next().map(|x| x.1) != Some('{') {
                            return err(pos, "expected `{` after `\\u`");
                        }
                        let mut code: u32 = 0;
                        let mut digits = 0;
                        loop {
                            match it.next() {
                                Some((_, '}')) if digits > 0 => break,
                                Some((_, h)) if h.is_ascii_hexdigit() && digits < 6 => {
                                    code = code * 16 + h.to_digit(16).unwrap_or(0);
                                    digits += 1;
                                }
                                _ => return err(pos, "malformed `\\u{…}` escape (1 to 6 hex digits)"),
                            }
                        }
                        match char::from_u32(code) {
                            Some(ch) => out.push(ch),
                            None => {
                                return err(pos, format!("`\\u{{{code:X}}}` is not a Unicode scalar value"))
                            }
                        }
                    }
                    other => return err(pos, format!("unknown escape `\\{}`", other.escape_debug())),
                }
            }
            c => out.push(c),
        }
    }
    err(start, "unterminated string")
}

/// Writes `s` as a string literal.
pub(crate) fn quote(s: &str, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            c if c.is_control() => out.push_str(&format!("\\u{{{:X}}}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;

    fn toks(s: &str) -> Vec<Tok> {
        let (t, e) = lex(s);
        assert!(e.is_none());
        t.into_iter().map(|t| t.0).collect()
    }

    fn lex_err(s: &str) -> usize {
        let (t, e) = lex(s);
        let pos = e.unwrap().pos;
        assert_eq!(t.last(), Some(&(Tok::Eof, pos)));
        pos
    }

    #[test]
    fn numbers_and_signs() {
        assert_eq!(
            toks("-1.5e-3 0x3C -inf 1e+5 -> -"),
            vec![
                Tok::Num("-1.5e-3".into()),
                Tok::Num("0x3C".into()),
                Tok::Minus,
                Tok::Ident("inf".into()),
                Tok::Num("1e+5".into()),
                Tok::Arrow,
                Tok::Minus,
                Tok::Eof
            ]
        );
        // A hex number takes no exponent sign: `0x1e-5` is `0x1e` then `-5`.
        assert_eq!(toks("0x1e-5"), vec![Tok::Num("0x1e".into()), Tok::Num("-5".into()), Tok::Eof]);
    }

    #[test]
    fn strings_escape_round_trip() {
        let s = "a\"b\\c\nd\te\r\u{1}\u{7f}\u{85}é😀";
        let mut q = String::new();
        quote(s, &mut q);
        assert!(!q.contains('\n') && !q.contains('\u{1}') && !q.contains('\u{85}'));
        assert_eq!(toks(&q), vec![Tok::Str(s.to_string()), Tok::Eof]);
    }

    #[test]
    fn errors() {
        assert_eq!(lex_err("  \"abc"), 2);
        assert_eq!(lex_err("\"a\\qb\""), 2);
        assert_eq!(lex_err("x % y"), 2);
        assert_eq!(lex_err("%99999999999"), 0);
        assert_eq!(lex_err("a $"), 2);
        assert_eq!(lex_err("\"\\u{110000}\""), 1);
        assert_eq!(lex_err("\"\\u{}\""), 1);
        assert_eq!(lex_err("\"\\"), 0);
    }

    #[test]
    fn comments_skipped() {
        assert_eq!(toks("a // b \"c\n d"), vec![Tok::Ident("a".into()), Tok::Ident("d".into()), Tok::Eof]);
    }
}
