//! Fuzz-corpus replays and seeded generators: what every `tests/fuzz_corpus.rs` needs so
//! that the property a cargo-fuzz target checks (never a panic) holds in every test run.

use std::any::Any;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;

/// xorshift64 (shifts 13, 7, 17): a small seeded generator, the same stream every run.
#[derive(Clone, Debug)]
pub struct XorShift(pub u64);

impl XorShift {
    /// A generator for any seed, 0 included: the seed spread by the golden-ratio
    /// multiplier and made odd (the test-data fillers' start).
    pub fn spread(seed: u64) -> XorShift {
        XorShift(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    /// The next 64 bits.
    #[allow(clippy::should_implement_trait)]
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// A number in `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }

    /// An element of a non-empty slice.
    pub fn pick<'a, T>(&mut self, v: &'a [T]) -> &'a T {
        &v[self.below(v.len())]
    }
}

/// xorshift64* (shifts 12, 25, 27, then a multiply): better low bits than [`XorShift`].
#[derive(Clone, Debug)]
pub struct XorShiftStar(pub u64);

impl XorShiftStar {
    /// The next 64 bits.
    #[allow(clippy::should_implement_trait)]
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// A number in `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }

    /// An element of a non-empty slice.
    pub fn pick<'a, T>(&mut self, v: &'a [T]) -> &'a T {
        &v[self.below(v.len())]
    }
}

/// Byte values that sit on encoding edges (varint continuation bits, -1, 0, 1).
pub const EDGE_BYTES: [u8; 5] = [0x00, 0x01, 0x7f, 0x80, 0xff];

/// Byte-level edits for mutators. Each draws from the generator in a fixed order, so a
/// mutator made of them keeps its stream (and the mutants a seed gives stay the same).
pub mod edit {
    use super::XorShift;

    /// Flips one bit of a non-empty buffer.
    pub fn flip_bit(rng: &mut XorShift, d: &mut [u8]) {
        let i = rng.below(d.len());
        d[i] ^= 1 << rng.below(8);
    }

    /// Sets one byte of a non-empty buffer to one of `values`.
    pub fn set_byte(rng: &mut XorShift, d: &mut [u8], values: &[u8]) {
        let i = rng.below(d.len());
        d[i] = values[rng.below(values.len())];
    }

    /// Cuts the buffer at a random length (possibly all of it, possibly none).
    pub fn truncate(rng: &mut XorShift, d: &mut Vec<u8>) {
        d.truncate(rng.below(d.len() + 1));
    }

    /// Inserts 1 to `most` random bytes at a random place.
    pub fn insert_random(rng: &mut XorShift, d: &mut Vec<u8>, most: usize) {
        let i = rng.below(d.len() + 1);
        let n = 1 + rng.below(most);
        let ins: Vec<u8> = (0..n).map(|_| rng.next() as u8).collect();
        d.splice(i..i, ins);
    }

    /// Removes one byte (not the last) of a buffer longer than 2; a shorter one is left.
    pub fn remove_byte(rng: &mut XorShift, d: &mut Vec<u8>) {
        if d.len() > 2 {
            let i = rng.below(d.len() - 1);
            d.remove(i);
        }
    }
}

/// The message of a panic payload (empty when it is neither a `String` nor a `&str`).
pub fn panic_message(payload: &(dyn Any + Send)) -> String {
    payload
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_default()
}

/// Runs `f`, turning a panic into its message.
pub fn catch<T>(f: impl FnOnce() -> T) -> Result<T, String> {
    catch_unwind(AssertUnwindSafe(f)).map_err(|p| panic_message(&*p))
}

/// The files of a corpus folder as (name, bytes), sorted by name.
pub fn corpus(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let entries =
        std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e} (run once with KILN_BLESS=1)", dir.display()));
    let mut files: Vec<(String, Vec<u8>)> = entries
        .map(|e| {
            let p = e.expect("corpus entry").path();
            let name = p.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
            let bytes = std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
            (name, bytes)
        })
        .collect();
    files.sort();
    files
}

/// Replays a corpus whose seeds a writer produces: under `KILN_BLESS` first rewrites the
/// seed files; then `check` (which returns whether the input was accepted, or the panic
/// message) must not panic on any file, the folder must hold every seed as the writer
/// produces it today, and every seed must be accepted. `what` names the code under test
/// in messages ("the reader").
pub fn replay_corpus(dir: &Path, seeds: &[(&str, Vec<u8>)], what: &str, check: impl Fn(&[u8]) -> Result<bool, String>) {
    if crate::blessing() {
        std::fs::create_dir_all(dir).expect("mkdir");
        for (name, bytes) in seeds {
            std::fs::write(dir.join(name), bytes).expect("write seed");
        }
    }
    let files = corpus(dir);
    for (name, data) in &files {
        if let Err(m) = check(data) {
            panic!("{}/{name} panics {what}: {m}", dir.display());
        }
    }
    assert!(files.len() >= seeds.len(), "corpus is missing its seeds");
    for (name, bytes) in seeds {
        let committed = files.iter().find(|(n, _)| n == name).map(|(_, b)| b);
        assert!(committed == Some(bytes), "{name} is missing or stale; rerun with KILN_BLESS=1");
        assert_eq!(check(bytes), Ok(true), "{name} is accepted");
    }
}

/// The mutation loop of a fuzz test: `rounds` mutants of each of `seeds` (named by
/// `names`), made by `mutant(seed index, round)` (the caller's seeded generator lives in
/// that closure, so the stream is the caller's own), each given to `check` (which returns
/// whether the input was accepted, or the panic message). A mutant that panics fails the
/// test, saved first to `fuzz/corpus-tmp/crash-NAME-ROUND` for the cargo-fuzz target to
/// replay. `what` names the code under test in messages ("the loader"). Returns how
/// many mutants were accepted, of how many.
pub fn mutation_rounds<N: AsRef<str>>(
    names: &[N],
    rounds: usize,
    what: &str,
    mut mutant: impl FnMut(usize, usize) -> Vec<u8>,
    check: impl Fn(&[u8]) -> Result<bool, String>,
) -> (usize, usize) {
    let (mut accepted, mut total) = (0, 0);
    for (i, name) in names.iter().enumerate() {
        let name = name.as_ref();
        for round in 0..rounds {
            let m = mutant(i, round);
            match check(&m) {
                Ok(ok) => accepted += ok as usize,
                Err(msg) => {
                    let out = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus-tmp");
                    let _ = std::fs::create_dir_all(&out);
                    let f = out.join(format!("crash-{name}-{round}"));
                    let _ = std::fs::write(&f, &m);
                    panic!("mutation {round} of {name} panics {what} (saved to {}): {msg}", f.display());
                }
            }
            total += 1;
        }
    }
    (accepted, total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generators_are_the_published_ones() {
        // xorshift64 from 1: 1 ^ 1<<13 = 0x2001, ^ >>7 = 0x2041, ^ <<17 = 0x4082_2041.
        assert_eq!(XorShift(1).next(), 0x4082_2041);
        let mut r = XorShift(7);
        assert!((0..100).all(|_| r.below(3) < 3) && r.below(0) == 0);
        assert_eq!(XorShift(5).pick(&[9]), &9);
        // xorshift64* from 1: 1 ^ 1<<25 = 0x200_0001, ^ >>27 unchanged, times the multiplier.
        assert_eq!(XorShiftStar(1).next(), 0x0200_0001u64.wrapping_mul(0x2545_F491_4F6C_DD1D));
    }

    #[test]
    fn panics_become_messages() {
        assert_eq!(catch(|| 3), Ok(3));
        assert_eq!(catch(|| -> u8 { panic!("boom {}", 1) }), Err("boom 1".to_string()));
        assert_eq!(catch(|| -> u8 { std::panic::panic_any(5u8) }), Err(String::new()));
    }
}
