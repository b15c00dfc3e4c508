//! The text form of the tensor level.
//!
//! [`print`](fn@print) writes a [`Graph`](crate::Graph) as text and [`parse`](fn@parse)
//! reads it back: `parse(print(g))` equals `g` (same value ids, names, types, constant
//! bytes, attributes, nodes, operands, graph inputs and outputs) and print → parse → print
//! gives the same bytes.
//!
//! # Syntax
//!
//! ```text
//! graph @lenet(%0: f32[1,1,28,28] "input") -> (%5) {
//!   %1 = const f32[6,1,5,5] blob(0) "conv1.weight"
//!   %2 = const f32[6] [0.5, -0.0, inf, nan, 1e-7, 3.0] "conv1.bias"
//!   %3 = Conv(%0, %1, %2) {kernel_shape = [5, 5], pads = [2, 2, 2, 2]} : f32[1,6,28,28] node "conv1"
//!   %4, %5 = Split(%3, _) {axis = 1, num_outputs = 2} : f32[1,3,28,28] "a", f32[1,3,28,28] "b"
//! }
//! blobs {
//!   0: "AAAAAAAA..."
//!      "AAAAAAAA..."
//! }
//! ```
//!
//! - A graph whose [`QuantSemantics`](crate::QuantSemantics) is not the default says so
//!   after its name: `graph @name quant onnxruntime_cpu (…)`.
//! - `%N` names value `N` of the graph's value arena; every id from `%0` to the largest one
//!   is defined exactly once: by the signature (graph inputs, in order), by `const`, or as a
//!   result of a node. Operands must be defined on an earlier line; the graph's outputs,
//!   listed after `->`, may be any values.
//! - A value's name, when not empty, follows its type as a quoted string; a node's name
//!   follows its result types as `node "name"`. Strings escape `"`, `\`, and control
//!   characters (`\n`, `\t`, `\r`, `\u{1F}`).
//! - `_` is an absent optional operand. A node without results is written without `=`.
//! - Attributes come in name order: `5` (int), `5.0` (float), `"s"` (string), `[1, 2]`
//!   (ints), `[1.0, 2.5]` (floats), `["a", "b"]` (strings), `ints []` / `floats []` /
//!   `strings []` (empty lists), `f32[2] [1.0, 2.0]` (tensor). Names that are not plain
//!   identifiers are quoted.
//! - Constants up to [`INLINE_LIMIT`] elements are written inline as a flat row-major list;
//!   larger ones refer to a base64 blob in the trailing `blobs` section, as do constants
//!   whose bytes have no exact element form (a `bool` byte other than 0 or 1, a non-zero
//!   padding nibble of a packed type). Floats print as the shortest decimal that reads back
//!   to the same bits, plus `inf`, `-inf`, `nan` (the quiet NaN with sign and payload
//!   clear) and `nan(0x7FC00001)` (any other NaN, as its bits); `f16` and `bf16` the same.
//!   The 8-, 6- and 4-bit float types print their raw codes (`0x3C`), `bool` as
//!   `true`/`false`, integers in decimal.
//! - If a constant value's type differs from its tensor's type, the value's type follows the
//!   literal as `: f32[2,2]`.
//! - `//` starts a comment that runs to the end of the line.
//!
//! Errors ([`ParseError`]) carry the 1-based line and column (in characters) of the
//! offending token.

mod base64;
mod lex;
mod parse;
mod print;

pub use parse::parse;
pub use print::print;

/// The pieces of the text form that other levels' text forms (kiln-flow's) build on, so
/// that every level lexes, quotes, encodes blobs and writes numbers the same way: the
/// tokens, the lexer and a token cursor, string quoting, integer literals, base64 for
/// `blobs` sections, and the exact forms of floats and of small constants.
pub mod syntax {
    pub use super::base64::{decode_into as base64_decode, encode as base64_encode, DecodeError};
    pub use super::lex::{
        fail, int_parts, is_hex, is_ident, lex, lit_code, parse_int, quote, run, write_name, Cursor, SResult,
        SyntaxError, Tok,
    };
    pub use super::print::{fmt_f32, fmt_f64, inline_elements, BF16_NAN, F16_NAN, F32_NAN, F64_NAN};
}

/// Constants with at most this many elements are printed inline; larger ones as blobs.
pub const INLINE_LIMIT: usize = 16;

/// An error reading the text form, with the position of the offending token.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{line}:{col}: {message}")]
pub struct ParseError {
    /// 1-based line.
    pub line: usize,
    /// 1-based column, counted in characters.
    pub col: usize,
    /// What is wrong.
    pub message: String,
}

impl ParseError {
    /// The error `message` at byte offset `pos` of `src`, as a 1-based line and column
    /// (in characters).
    pub fn at(src: &str, pos: usize, message: String) -> ParseError {
        let mut pos = pos.min(src.len());
        while !src.is_char_boundary(pos) {
            pos -= 1;
        }
        let before = &src[..pos];
        let line = before.matches('\n').count() + 1;
        let line_start = before.rfind('\n').map_or(0, |k| k + 1);
        let col = before.get(line_start..).map_or(0, |s| s.chars().count()) + 1;
        ParseError { line, col, message }
    }
}
