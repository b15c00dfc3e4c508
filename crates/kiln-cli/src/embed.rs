//! `kiln compile --emit c-array|object`: an artifact as something a firmware image links in.
//!
//! Both forms define two symbols: `NAME`, the artifact's bytes aligned to 64 (so the runtime
//! uses its constants in place, `kiln_module_load_bytes_nocopy`), and `NAME_len`, their
//! count as an `unsigned long`.

use std::fmt::Write as _;
use std::path::Path;

use object::write::{Object, StandardSection, Symbol, SymbolSection};
use object::{Architecture, BinaryFormat, Endianness, SymbolFlags, SymbolKind, SymbolScope};

/// The alignment of the artifact's bytes: the runtime's, for constants used in place.
const ALIGN: u64 = 64;

/// The symbol to define: `--symbol`, else the output's file stem with every character
/// outside `[A-Za-z0-9_]` made `_` (and `_` in front of a leading digit).
pub(crate) fn symbol(given: Option<&str>, output: &Path) -> Result<String, String> {
    if let Some(s) = given {
        let valid = s.chars().next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        return if valid {
            Ok(s.to_string())
        } else {
            Err(format!("--symbol `{s}`: not a C identifier (letters, digits and _, not starting with a digit)"))
        };
    }
    let stem = output.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
    let mut s: String = stem.chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '_' }).collect();
    if s.is_empty() || s.starts_with(|c: char| c.is_ascii_digit()) {
        s.insert(0, '_');
    }
    Ok(s)
}

/// C source defining `name` (the bytes, aligned to 64) and `name_len`.
pub(crate) fn c_array(bytes: &[u8], name: &str) -> String {
    let mut s = String::with_capacity(bytes.len() * 5 + 512);
    let _ = writeln!(s, "/* A kiln artifact ({} bytes), written by kiln compile --emit c-array. */", bytes.len());
    let _ = writeln!(s, "#ifdef __cplusplus\nextern \"C\" {{\n#endif");
    let _ = writeln!(s, "extern const unsigned char {name}[];\nextern const unsigned long {name}_len;");
    let _ = writeln!(s, "const unsigned char {name}[] __attribute__((aligned({ALIGN}))) = {{");
    for line in bytes.chunks(16) {
        let row: Vec<String> = line.iter().map(|b| format!("0x{b:02x}")).collect();
        let _ = writeln!(s, "  {},", row.join(", "));
    }
    let _ = writeln!(s, "}};\nconst unsigned long {name}_len = {};", bytes.len());
    let _ = writeln!(s, "#ifdef __cplusplus\n}}\n#endif");
    s
}

/// An x86-64 ELF relocatable object with the bytes in `.rodata` (aligned to 64) as the
/// global symbol `name`, and their count as the global 8-byte `name_len`.
pub(crate) fn object(bytes: &[u8], name: &str) -> Result<Vec<u8>, String> {
    let mut obj = Object::new(BinaryFormat::Elf, Architecture::X86_64, Endianness::Little);
    let rodata = obj.section_id(StandardSection::ReadOnlyData);
    let mut define = |sym: &str, data: &[u8], align: u64| {
        let at = obj.append_section_data(rodata, data, align);
        obj.add_symbol(Symbol {
            name: sym.as_bytes().to_vec(),
            value: at,
            size: data.len() as u64,
            kind: SymbolKind::Data,
            scope: SymbolScope::Dynamic,
            weak: false,
            section: SymbolSection::Section(rodata),
            flags: SymbolFlags::None,
        });
    };
    define(name, bytes, ALIGN);
    define(&format!("{name}_len"), &(bytes.len() as u64).to_le_bytes(), 8);
    obj.write().map_err(|e| format!("cannot write the object: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn symbols() {
        assert_eq!(symbol(None, Path::new("out/lenet-5.o")).unwrap(), "lenet_5");
        assert_eq!(symbol(None, Path::new("3d.c")).unwrap(), "_3d");
        assert_eq!(symbol(Some("model"), Path::new("x.o")).unwrap(), "model");
        assert!(symbol(Some("9x"), Path::new("x.o")).is_err());
        assert!(symbol(Some("a-b"), Path::new("x.o")).is_err());
    }

    #[test]
    fn c_array_text() {
        let s = c_array(&[1, 2, 255], "m");
        assert!(s.contains("const unsigned char m[] __attribute__((aligned(64))) = {\n  0x01, 0x02, 0xff,\n};"), "{s}");
        assert!(s.contains("const unsigned long m_len = 3;"), "{s}");
    }
}
