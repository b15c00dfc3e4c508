//! Reading artifacts and weights files so that the runtime can use them in place: the
//! bytes start at a 64-byte-aligned address, the alignment the constants section has
//! inside the file (the runtime copies a constant pool it finds misaligned).

use std::io::Read;
use std::path::{Path, PathBuf};

use kiln_module::sections::{read_program, ConstantsView};

/// A file's bytes at a 64-byte-aligned address.
#[derive(Debug, Clone)]
pub struct AlignedBytes {
    buf: Vec<u8>,
    start: usize,
    len: usize,
}

impl AlignedBytes {
    /// Reads the whole file (one allocation, no copy; large files on huge pages where the
    /// system has them, see [`crate::pages`]).
    pub fn read(path: &Path) -> std::io::Result<AlignedBytes> {
        let mut f = std::fs::File::open(path)?;
        let len = usize::try_from(f.metadata()?.len()).map_err(|_| std::io::Error::other("file too large"))?;
        let mut a = AlignedBytes::try_zeroed(len)?;
        f.read_exact(a.bytes_mut())?;
        Ok(a)
    }

    /// Copies `bytes` to an aligned buffer.
    pub fn copy_from(bytes: &[u8]) -> AlignedBytes {
        let mut a = AlignedBytes::zeroed(bytes.len());
        a.bytes_mut().copy_from_slice(bytes);
        a
    }

    /// `len` zero bytes at a 64-byte-aligned address, on huge pages where the system has
    /// them (asked before the first write): also a caller's input or output buffer of the
    /// size a tensor needs.
    ///
    /// Panics when the memory cannot be had; [`AlignedBytes::try_zeroed`] is for sizes
    /// that come from untrusted input (an artifact's tensor sizes).
    pub fn zeroed(len: usize) -> AlignedBytes {
        match AlignedBytes::try_zeroed(len) {
            Ok(a) => a,
            Err(e) => panic!("{e}"),
        }
    }

    /// [`AlignedBytes::zeroed`], or an error of kind [`std::io::ErrorKind::OutOfMemory`]
    /// naming the size when the allocator refuses it.
    pub fn try_zeroed(len: usize) -> std::io::Result<AlignedBytes> {
        let refused = || std::io::Error::new(std::io::ErrorKind::OutOfMemory, format!("cannot allocate {len} bytes"));
        let total = len.checked_add(63).ok_or_else(refused)?;
        let layout = std::alloc::Layout::array::<u8>(total).map_err(|_| refused())?;
        // Zeroed by the allocator as `vec![0u8; n]` is (fresh pages stay untouched, so
        // the advice below still decides their size), but a refusal is an error here.
        // SAFETY: the layout's size is at least 63, not zero.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        if ptr.is_null() {
            return Err(refused());
        }
        // SAFETY: `ptr` comes from the global allocator with the layout of `total` bytes
        // at alignment 1 (a `Vec<u8>`'s own), all of them initialised (zero); the Vec
        // takes ownership with length and capacity `total`.
        let buf = unsafe { Vec::from_raw_parts(ptr, total, total) };
        crate::pages::prefer_huge_pages(buf.as_ptr(), buf.len());
        let start = buf.as_ptr().align_offset(64).min(63);
        Ok(AlignedBytes { buf, start, len })
    }

    /// The bytes.
    pub fn bytes(&self) -> &[u8] {
        &self.buf[self.start..self.start + self.len]
    }

    /// The bytes, to write.
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        &mut self.buf[self.start..self.start + self.len]
    }
}

/// The weights file an artifact names, beside it (where `kiln run` looks for it); `None`
/// for an artifact that embeds its weights or that does not parse, and for a recorded
/// name that is not a plain file name (the loader then reports the weights missing).
pub fn weights_beside(artifact_path: &Path, artifact: &[u8]) -> Option<PathBuf> {
    let container = kiln_module::Module::parse(artifact).ok()?;
    let program = read_program(&container).ok()?;
    match program.constants {
        ConstantsView::External { file, .. } => {
            // Never leave the artifact's folder on the artifact's word.
            let plain = Path::new(file).file_name().is_some_and(|n| n == file);
            let dir = artifact_path.parent().unwrap_or(Path::new("."));
            plain.then(|| dir.join(file))
        }
        ConstantsView::Embedded(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned() {
        for n in [0, 1, 63, 64, 1000] {
            let data: Vec<u8> = (0..n).map(|i| i as u8).collect();
            let a = AlignedBytes::copy_from(&data);
            assert_eq!(a.bytes(), &data[..]);
            assert_eq!(a.bytes().as_ptr() as usize % 64, 0);
        }
        let p = std::env::temp_dir().join(format!("kiln-fs-test-{}", std::process::id()));
        std::fs::write(&p, b"kiln").expect("write");
        let mut z = AlignedBytes::zeroed(1000);
        assert_eq!(z.bytes().as_ptr() as usize % 64, 0);
        assert!(z.bytes().iter().all(|&b| b == 0) && z.bytes().len() == 1000);
        z.bytes_mut()[999] = 7;
        assert_eq!(z.bytes()[999], 7);
        let a = AlignedBytes::read(&p).expect("read");
        // Sizes no allocator gives are an error, not an abort.
        let e = AlignedBytes::try_zeroed(usize::MAX).expect_err("usize::MAX bytes");
        assert_eq!(e.kind(), std::io::ErrorKind::OutOfMemory);
        assert!(AlignedBytes::try_zeroed(1 << 62).is_err());
        assert_eq!((a.bytes(), a.bytes().as_ptr() as usize % 64), (&b"kiln"[..], 0));
        let _ = std::fs::remove_file(&p);
    }
}
