//! Tokens of the text forms, the lexer, and a cursor over the tokens.
//!
//! The tensor level's text form and the flow level's (in kiln-flow) share these: the
//! same identifiers, numbers, strings, `%N` references, comments and punctuation.

use crate::dtype::DType;
use crate::shape::{Shape, TensorType};
use core::fmt;
use std::collections::HashMap;

/// One token.
#[allow(missing_docs)]
#[derive(Clone, Debug, PartialEq)]
pub enum Tok {
    /// `[A-Za-z_][A-Za-z0-9_.]*`: keywords, op names, dtypes, attribute names.
    Ident(String),
    /// `%N`: value `N` of a graph, buffer `N` of a flow program.
    Ref(u32),
    /// A number as written: `-`? then a digit, then letters, digits, `.`, and a sign
    /// right after an exponent `e`/`E` (hex numbers `0x…` take no sign).
    Num(String),
    /// A string literal, escapes resolved.
    Str(String),
    /// `-` not followed by a digit or `>` (as in `-inf`).
    Minus,
    Arrow,
    At,
    /// `<` (the tensor level has no use for it; its parser reports it where it appears).
    Lt,
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
            Tok::Ident(s) | Tok::Num(s) if s.chars().count() > 24 => {
                write!(f, "`{}…`", s.chars().take(24).collect::<String>())
            }
            Tok::Ident(s) | Tok::Num(s) => write!(f, "`{s}`"),
            Tok::Ref(v) => write!(f, "`%{v}`"),
            Tok::Str(s) if s.chars().count() > 24 => {
                write!(f, "string \"{}…\"", s.chars().take(24).collect::<String>().escape_debug())
            }
            Tok::Str(s) => write!(f, "string \"{}\"", s.escape_debug()),
            Tok::Minus => f.write_str("`-`"),
            Tok::Arrow => f.write_str("`->`"),
            Tok::At => f.write_str("`@`"),
            Tok::Lt => f.write_str("`<`"),
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

/// A lexing or parsing error at a byte offset of the text ([`super::ParseError::at`]
/// turns it into a line and column).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SyntaxError {
    /// Byte offset of the offending token.
    pub pos: usize,
    /// What is wrong.
    pub message: String,
}

/// The result of a lexing or parsing step.
pub type SResult<T> = Result<T, SyntaxError>;

/// Fails at `pos` with `message`.
pub fn fail<T>(pos: usize, message: impl Into<String>) -> SResult<T> {
    Err(SyntaxError { pos, message: message.into() })
}

fn is_ident_start(c: u8) -> bool {
    c.is_ascii_alphabetic() || c == b'_'
}

fn is_ident_char(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_' || c == b'.'
}

/// True if `s` can be written as a bare identifier (else it is quoted).
pub fn is_ident(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty() && is_ident_start(b[0]) && b[1..].iter().all(|&c| is_ident_char(c))
}

/// Splits `src` into tokens with their byte offsets. The last token is [`Tok::Eof`]: at the
/// end of the text, or where the first lexing error (also returned) stops the scan, so
/// that the parser can report whichever error comes first in the text.
pub fn lex(src: &str) -> (Vec<(Tok, usize)>, Option<SyntaxError>) {
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

fn lex_into(src: &str, toks: &mut Vec<(Tok, usize)>) -> Result<(), SyntaxError> {
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
            b'<' => Some(Tok::Lt),
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
                let exp_sign = !hex && (d == b'+' || d == b'-') && i > start && matches!(b[i - 1], b'e' | b'E');
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
                return fail(start, "expected a number after `%`");
            }
            let n: u32 = src[digits..i]
                .parse()
                .map_err(|_| SyntaxError { pos: start, message: format!("`%{}` is too large", &src[digits..i]) })?;
            toks.push((Tok::Ref(n), start));
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
            return fail(start, format!("unexpected character {ch:?}"));
        }
    }
    Ok(())
}

/// Reads the string literal starting at `b[start] == '"'`; returns it and the offset after it.
fn string(src: &str, start: usize) -> Result<(String, usize), SyntaxError> {
    let mut out = String::new();
    let mut it = src[start + 1..].char_indices().map(|(k, c)| (start + 1 + k, c)).peekable();
    while let Some((pos, c)) = it.next() {
        match c {
            '"' => return Ok((out, pos + 1)),
            '\n' | '\r' => return fail(start, "unterminated string (strings end on their line)"),
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
                            return fail(pos, "expected `{` after `\\u`");
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
                                _ => return fail(pos, "malformed `\\u{…}` escape (1 to 6 hex digits)"),
                            }
                        }
                        match char::from_u32(code) {
                            Some(ch) => out.push(ch),
                            None => return fail(pos, format!("`\\u{{{code:X}}}` is not a Unicode scalar value")),
                        }
                    }
                    other => return fail(pos, format!("unknown escape `\\{}`", other.escape_debug())),
                }
            }
            c => out.push(c),
        }
    }
    fail(start, "unterminated string")
}

/// Writes `s` as a string literal.
pub fn quote(s: &str, out: &mut String) {
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

/// Writes `s` bare when it is an identifier, else as a string literal.
pub fn write_name(out: &mut String, s: &str) {
    if is_ident(s) {
        out.push_str(s);
    } else {
        quote(s, out);
    }
}

/// Sign, radix and digits of an integer literal (decimal or `0x` hex, optionally
/// negative), if it is one, whatever its size.
pub fn int_parts(s: &str) -> Option<(bool, u32, &str)> {
    let (neg, body) = match s.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, s),
    };
    let (radix, digits) = match body.strip_prefix("0x").or_else(|| body.strip_prefix("0X")) {
        Some(hex) => (16, hex),
        None => (10, body),
    };
    let ok = !digits.is_empty() && digits.chars().all(|c| c.is_digit(radix));
    ok.then_some((neg, radix, digits))
}

/// An integer literal (decimal or `0x` hex, optionally negative) of at most 64 bits of
/// magnitude.
pub fn parse_int(s: &str) -> Option<i128> {
    let (neg, radix, digits) = int_parts(s)?;
    let mag = u64::from_str_radix(digits, radix).ok()?;
    Some(if neg { -i128::from(mag) } else { i128::from(mag) })
}

/// True for a number written in hex (`0x…`, `-0x…`).
pub fn is_hex(s: &str) -> bool {
    let b = s.strip_prefix('-').unwrap_or(s);
    b.starts_with("0x") || b.starts_with("0X")
}

/// A raw code of a low-precision float type of `max` at most (written in hex by the
/// printers) from a number literal `num` (`None`: the literal is not a number).
pub fn lit_code(num: Option<&str>, pos: usize, what: impl fmt::Display, max: u8) -> SResult<u8> {
    let Some(s) = num else {
        return fail(pos, format!("expected a raw {what} code such as `0x{max:X}`"));
    };
    match parse_int(s) {
        Some(v) if (0..=i128::from(max)).contains(&v) => Ok(v as u8),
        Some(_) => fail(pos, format!("code `{s}` is out of range for {what} (0x0 to 0x{max:X})")),
        None => fail(pos, format!("expected a raw {what} code such as `0x{max:X}`, found `{s}`")),
    }
}

/// The tokens of a text with a read position: what a recursive-descent parser steps over.
#[derive(Debug)]
pub struct Cursor {
    toks: Vec<(Tok, usize)>,
    i: usize,
}

impl Cursor {
    /// A cursor at the first of `toks` (as [`lex`] returns them, ending in [`Tok::Eof`]).
    pub fn new(toks: Vec<(Tok, usize)>) -> Cursor {
        Cursor { toks, i: 0 }
    }

    /// The next token.
    pub fn peek(&self) -> &Tok {
        self.toks.get(self.i).map_or(&Tok::Eof, |t| &t.0)
    }

    /// The byte offset of the next token.
    pub fn pos(&self) -> usize {
        self.toks.get(self.i).or(self.toks.last()).map_or(0, |t| t.1)
    }

    /// Takes the next token (leaving `Eof` in its slot: a parser never looks back).
    pub fn bump(&mut self) -> (Tok, usize) {
        let pos = self.pos();
        match self.toks.get_mut(self.i) {
            Some(slot) if slot.0 != Tok::Eof => {
                self.i += 1;
                (core::mem::replace(&mut slot.0, Tok::Eof), pos)
            }
            _ => (Tok::Eof, pos),
        }
    }

    /// Takes the next token if it is `t`.
    pub fn eat(&mut self, t: &Tok) -> bool {
        if self.peek() == t {
            self.bump();
            true
        } else {
            false
        }
    }

    /// True if the next token is the identifier `kw`.
    pub fn is_kw(&self, kw: &str) -> bool {
        matches!(self.peek(), Tok::Ident(s) if s == kw)
    }

    /// Consumes `t` (returning its offset) or fails with "expected `t` CONTEXT, found …".
    pub fn expect(&mut self, t: &Tok, context: &str) -> SResult<usize> {
        let pos = self.pos();
        if self.eat(t) {
            Ok(pos)
        } else {
            fail(pos, format!("expected {t} {context}, found {}", self.peek()))
        }
    }

    /// Consumes the identifier `kw` (returning its offset) or fails like [`Cursor::expect`].
    pub fn expect_kw(&mut self, kw: &str, context: &str) -> SResult<usize> {
        let pos = self.pos();
        if self.is_kw(kw) {
            self.bump();
            Ok(pos)
        } else {
            fail(pos, format!("expected `{kw}` {context}, found {}", self.peek()))
        }
    }

    /// The optional `(0x…)` after `nan`: the NaN's bits and their offset.
    pub fn nan_bits(&mut self) -> SResult<Option<(u64, usize)>> {
        if !self.eat(&Tok::LParen) {
            return Ok(None);
        }
        let (t, pos) = self.bump();
        let bits = match &t {
            Tok::Num(s) if s.starts_with("0x") || s.starts_with("0X") => {
                parse_int(s).and_then(|v| u64::try_from(v).ok())
            }
            _ => None,
        };
        let Some(bits) = bits else {
            return fail(pos, format!("expected the NaN's bits in hex (`nan(0x7FC00001)`), found {t}"));
        };
        self.expect(&Tok::RParen, "after the NaN's bits")?;
        Ok(Some((bits, pos)))
    }

    /// A non-negative integer and its position; `what` names it in the error.
    pub fn uint(&mut self, what: &str) -> SResult<(u64, usize)> {
        let (t, pos) = self.bump();
        let v = match &t {
            Tok::Num(s) => parse_int(s).and_then(|v| u64::try_from(v).ok()),
            _ => None,
        };
        match v {
            Some(v) => Ok((v, pos)),
            None => fail(pos, format!("expected {what} (a non-negative integer), found {t}")),
        }
    }

    /// `blob(N)`, a constant's reference to a blob, when one stands next: the blob
    /// number and its position.
    pub fn blob_ref(&mut self) -> SResult<Option<(u64, usize)>> {
        if !self.is_kw("blob") {
            return Ok(None);
        }
        self.bump();
        self.expect(&Tok::LParen, "after `blob`")?;
        let (index, pos) = self.uint("a blob number")?;
        self.expect(&Tok::RParen, "after the blob number")?;
        Ok(Some((index, pos)))
    }

    /// A `blobs { N: "base64" … }` section, at its keyword: the bytes of each blob and
    /// the position of its number.
    pub fn blobs(&mut self) -> SResult<HashMap<u64, (Vec<u8>, usize)>> {
        self.bump();
        self.expect(&Tok::LBrace, "after `blobs`")?;
        let mut blobs = HashMap::new();
        while !self.eat(&Tok::RBrace) {
            let (index, pos) = self.uint("a blob number or `}`")?;
            if blobs.contains_key(&index) {
                return fail(pos, format!("blob {index} defined twice"));
            }
            self.expect(&Tok::Colon, "after the blob number")?;
            let data = self.blob_data(index)?;
            blobs.insert(index, (data, pos));
        }
        Ok(blobs)
    }

    /// The bytes of blob `index` of a `blobs` section: one or more base64 strings, of which
    /// only the last may end in `=` padding.
    pub fn blob_data(&mut self, index: u64) -> SResult<Vec<u8>> {
        if !matches!(self.peek(), Tok::Str(_)) {
            return fail(self.pos(), format!("expected the blob's base64 text (strings), found {}", self.peek()));
        }
        let mut data = Vec::new();
        let mut ended = false;
        while let Tok::Str(_) = self.peek() {
            let (t, spos) = self.bump();
            let Tok::Str(s) = t else { break };
            if ended {
                return fail(spos, format!("blob {index} continues after its `=` padding"));
            }
            // +1: the offset is inside the quotes (base64 has no escapes to skew it).
            ended = super::base64::decode_into(&s, &mut data).map_err(|e| SyntaxError {
                pos: spos + 1 + e.offset,
                message: format!("blob {index}: {}", e.message),
            })?;
        }
        Ok(data)
    }

    /// A tensor type, `DTYPE[d0,d1,…]` (`f32[]` for a scalar).
    pub fn tensor_type(&mut self) -> SResult<TensorType> {
        let (tok, pos) = self.bump();
        let Tok::Ident(name) = tok else {
            return fail(pos, format!("expected a tensor type such as `f32[2,3]`, found {tok}"));
        };
        let dtype: DType = name.parse().map_err(|_| SyntaxError { pos, message: format!("unknown dtype `{name}`") })?;
        self.expect(&Tok::LBrack, "after the dtype (a tensor type is written `f32[2,3]`, `f32[]` for a scalar)")?;
        let mut dims = Vec::new();
        if !self.eat(&Tok::RBrack) {
            loop {
                let (t, dpos) = self.bump();
                let dim = match &t {
                    Tok::Num(s) => parse_int(s).and_then(|v| usize::try_from(v).ok()),
                    _ => None,
                };
                match dim {
                    Some(d) => dims.push(d),
                    None => return fail(dpos, format!("expected a dimension (a non-negative integer), found {t}")),
                }
                if self.eat(&Tok::RBrack) {
                    break;
                }
                self.expect(&Tok::Comma, "or `]` after a dimension")?;
            }
        }
        let shape = Shape::new(dims).map_err(|e| SyntaxError { pos, message: format!("invalid shape: {e}") })?;
        Ok(TensorType::new(dtype, shape))
    }

    /// Succeeds at the end of the text.
    pub fn end(&self) -> SResult<()> {
        match self.peek() {
            Tok::Eof => Ok(()),
            t => fail(self.pos(), format!("expected end of input, found {t}")),
        }
    }
}

/// Runs `parse` over the tokens of `src` and reports whichever comes first in the text:
/// the parser's error or the lexing error that stopped the scan (then the parser, which
/// sees `Eof` there, usually fails at the same place).
pub fn run<T>(src: &str, parse: impl FnOnce(&mut Cursor) -> SResult<T>) -> Result<T, super::ParseError> {
    let (toks, lex_error) = lex(src);
    let mut cursor = Cursor::new(toks);
    let r = match (parse(&mut cursor), lex_error) {
        (Err(e), Some(l)) if l.pos <= e.pos => Err(l),
        (Err(e), _) => Err(e),
        (Ok(_), Some(l)) => Err(l),
        (Ok(v), None) => Ok(v),
    };
    r.map_err(|e| super::ParseError::at(src, e.pos, e.message))
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
    fn references_and_angle_brackets() {
        assert_eq!(toks("%12<"), vec![Tok::Ref(12), Tok::Lt, Tok::Eof]);
        assert_eq!(lex("%").1.map(|e| e.message), Some("expected a number after `%`".into()));
        let long = "a".repeat(30);
        assert_eq!(Tok::Ident(long).to_string(), format!("`{}…`", "a".repeat(24)));
    }

    #[test]
    fn cursor_steps_and_reports() {
        let mut c = Cursor::new(lex("a , b").0);
        assert!(c.is_kw("a") && !c.is_kw("b"));
        assert_eq!(c.expect_kw("a", "first"), Ok(0));
        assert!(!c.eat(&Tok::Colon) && c.eat(&Tok::Comma));
        let e = c.expect(&Tok::Colon, "here").unwrap_err();
        assert_eq!((e.pos, e.message.as_str()), (4, "expected `:` here, found `b`"));
        assert_eq!(c.end().unwrap_err().pos, 4);
        assert_eq!(c.bump(), (Tok::Ident("b".into()), 4));
        assert_eq!((c.bump(), c.end()), ((Tok::Eof, 5), Ok(())));
    }

    #[test]
    fn integer_literals() {
        assert_eq!(parse_int("-0x10"), Some(-16));
        assert_eq!(parse_int("18446744073709551615"), Some(u64::MAX as i128));
        assert_eq!(parse_int("18446744073709551616"), None);
        assert!(int_parts("18446744073709551616").is_some());
        assert_eq!(int_parts("1.5"), None);
        assert!(is_hex("-0X1f") && !is_hex("10"));
    }

    #[test]
    fn comments_skipped() {
        assert_eq!(toks("a // b \"c\n d"), vec![Tok::Ident("a".into()), Tok::Ident("d".into()), Tok::Eof]);
    }
}
