//! Replays the module reader's fuzz corpus (`fuzz/corpus/read_module`) and fuzzes
//! it further with a seeded mutation loop: `Module::parse` returns Ok or a typed
//! error for any bytes, never panics, and every section it hands out lies inside
//! the file. `KILN_BLESS=1` rewrites the seed files from the writer.

use kiln_module::{Module, ModuleWriter, SectionKind, Version};
use std::path::PathBuf;

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus/read_module")
}

fn seeds() -> Vec<(&'static str, Vec<u8>)> {
    let abi = Version { major: 1, minor: 0 };
    let mut a = ModuleWriter::new(abi);
    a.add(SectionKind::Signature, 8, b"sig".to_vec()).expect("add");
    a.add(SectionKind::Plan, 16, (0..100u8).collect()).expect("add");
    a.add(SectionKind::Constants, 64, vec![7u8; 300]).expect("add");
    a.add(SectionKind::Debug, 1, b"names".to_vec()).expect("add");
    let b = ModuleWriter::new(abi);
    vec![("four_sections.kiln", a.finish()), ("empty.kiln", b.finish())]
}

fn check(data: &[u8]) -> Result<bool, String> {
    kiln_filetest::fuzz::catch(|| match Module::parse(data) {
        Ok(m) => {
            for s in m.sections() {
                let start = s.bytes.as_ptr() as usize - data.as_ptr() as usize;
                assert!(start + s.bytes.len() <= data.len(), "section outside the file");
                assert_eq!(start as u64, s.offset);
            }
            true
        }
        Err(e) => {
            // Every error renders as one line.
            assert!(!e.to_string().contains('\n'));
            false
        }
    })
}

#[test]
fn corpus_replays() {
    kiln_filetest::fuzz::replay_corpus(&dir(), &seeds(), "the reader", check);
}

#[test]
fn mutations_never_panic() {
    let mut rng = kiln_filetest::fuzz::XorShift(0x1234_5678_9ABC_DEF1);
    let mut next = move || rng.next();
    let seeds = seeds();
    let names: Vec<&str> = seeds.iter().map(|(n, _)| *n).collect();
    let mutant = |i: usize, _| {
        let mut d = seeds[i].1.clone();
        for _ in 0..1 + next() % 3 {
            let r = next();
            match r % 4 {
                0 if !d.is_empty() => {
                    let i = (next() % d.len() as u64) as usize;
                    d[i] ^= 1 << ((r >> 8) % 8);
                }
                1 if !d.is_empty() => {
                    // Overwrite a header/table word with an extreme value.
                    let i = (next() % d.len().min(64 + 32 * 4) as u64) as usize;
                    let v = [0u8, 0xff, 0x80, 0x7f][(r >> 8) as usize % 4];
                    let end = (i + 8).min(d.len());
                    d[i..end].iter_mut().for_each(|b| *b = v);
                }
                2 => d.truncate((next() % (d.len() as u64 + 1)) as usize),
                _ => d.push(next() as u8),
            }
        }
        d
    };
    let (accepted, total) = kiln_filetest::fuzz::mutation_rounds(&names, 3000, "the reader", mutant, check);
    assert!(accepted < total);
}
