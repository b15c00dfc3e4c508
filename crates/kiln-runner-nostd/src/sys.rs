//! The platform layer: what the runner needs from the machine, on the C library alone
//! (`open`, `read`, `write`, `close`, `lseek`, `mkdir`, `malloc`, `free`,
//! `posix_memalign`, `strerror`; the runtime's loader adds `mmap`, `mprotect`,
//! `munmap`, `sysconf`). Linux x86-64 is the target; porting the runner means
//! rewriting this file.

use alloc::format;
use alloc::string::String;
use core::alloc::{GlobalAlloc, Layout};
use core::ffi::{c_void, CStr};

/// The global allocator: `malloc`, `realloc` and `free`, and `posix_memalign` for
/// alignments above what `malloc` guarantees.
pub struct Malloc;

/// What `malloc` aligns every block to on x86-64 glibc and musl.
const MALLOC_ALIGN: usize = 16;

// SAFETY: every block comes from the C allocator with at least the layout's size and
// alignment, and goes back to it through `free`/`realloc`.
unsafe impl GlobalAlloc for Malloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if layout.align() <= MALLOC_ALIGN && layout.align() <= layout.size() {
            // SAFETY: plain malloc; a null result is the allocator's refusal.
            unsafe { libc::malloc(layout.size()).cast() }
        } else {
            let mut p: *mut c_void = core::ptr::null_mut();
            // posix_memalign wants a power-of-two multiple of the pointer size.
            let align = layout.align().max(core::mem::size_of::<usize>());
            // SAFETY: `p` is a valid out-pointer; `align` is a power of two (Layout's
            // invariant) and a multiple of the pointer size.
            let rc = unsafe { libc::posix_memalign(&mut p, align, layout.size()) };
            if rc == 0 {
                p.cast()
            } else {
                core::ptr::null_mut()
            }
        }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, _layout: Layout) {
        // SAFETY: `ptr` came from `malloc` or `posix_memalign` (the trait's contract).
        unsafe { libc::free(ptr.cast()) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if layout.align() <= MALLOC_ALIGN && layout.align() <= new_size {
            // SAFETY: `ptr` is a live block of this allocator; realloc keeps malloc's
            // alignment, which covers `layout.align()`.
            unsafe { libc::realloc(ptr.cast(), new_size).cast() }
        } else {
            // SAFETY: the trait's contract carries over; `new_size` is non-zero and
            // with `layout.align()` forms a valid layout (the caller guarantees it).
            unsafe {
                let new = self.alloc(Layout::from_size_align_unchecked(new_size, layout.align()));
                if !new.is_null() {
                    core::ptr::copy_nonoverlapping(ptr, new, layout.size().min(new_size));
                    self.dealloc(ptr, layout);
                }
                new
            }
        }
    }
}

/// The calling thread's `errno`.
fn errno() -> i32 {
    // SAFETY: `__errno_location` returns a valid pointer to this thread's errno.
    unsafe { *libc::__errno_location() }
}

/// The C library's text for `errno` `e`, with the number, as std prints it.
fn os_error(e: i32) -> String {
    // SAFETY: strerror returns a NUL-terminated string that stays valid until the next
    // strerror call; the runner is single-threaded and copies it at once.
    let text = unsafe { CStr::from_ptr(libc::strerror(e)) };
    format!("{} (os error {e})", text.to_str().unwrap_or("unknown error"))
}

/// `path` as text for messages (a placeholder when it is not UTF-8: lossy decoding
/// would cost its own code).
pub fn show(path: &CStr) -> &str {
    path.to_str().unwrap_or("(a path that is not UTF-8)")
}

/// Writes all of `bytes` to descriptor `fd`.
pub fn write_all(fd: i32, mut bytes: &[u8]) -> Result<(), i32> {
    while !bytes.is_empty() {
        // SAFETY: the pointer and length describe the live slice `bytes`.
        let n = unsafe { libc::write(fd, bytes.as_ptr().cast(), bytes.len()) };
        if n < 0 {
            let e = errno();
            if e == libc::EINTR {
                continue;
            }
            return Err(e);
        }
        bytes = bytes.get(n as usize..).unwrap_or(&[]);
    }
    Ok(())
}

/// An open file descriptor, closed on drop.
struct Fd(i32);

impl Drop for Fd {
    fn drop(&mut self) {
        // SAFETY: the descriptor is ours and closed once.
        unsafe {
            libc::close(self.0);
        }
    }
}

/// Bytes at a 64-byte-aligned address: the alignment the runtime uses artifacts and
/// weights in place at (it copies a misaligned constant pool).
pub struct AlignedBuf {
    ptr: *mut u8,
    len: usize,
}

impl AlignedBuf {
    const ALIGN: usize = 64;

    fn layout(len: usize) -> Option<Layout> {
        Layout::from_size_align(len.max(1), Self::ALIGN).ok()
    }

    fn zeroed(len: usize) -> Option<AlignedBuf> {
        let layout = Self::layout(len)?;
        // SAFETY: the layout's size is at least one byte.
        let ptr = unsafe { alloc::alloc::alloc_zeroed(layout) };
        (!ptr.is_null()).then_some(AlignedBuf { ptr, len })
    }

    /// The bytes.
    pub fn bytes(&self) -> &[u8] {
        // SAFETY: `ptr` holds `len` initialised (zeroed, then read) bytes, owned by self.
        unsafe { core::slice::from_raw_parts(self.ptr, self.len) }
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `bytes`, and `&mut self` makes the access exclusive.
        unsafe { core::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        if let Some(layout) = Self::layout(self.len) {
            // SAFETY: allocated in `zeroed` with this same layout.
            unsafe { alloc::alloc::dealloc(self.ptr, layout) }
        }
    }
}

/// Reads the whole file at `path` into an aligned buffer.
pub fn read_file(path: &CStr) -> Result<AlignedBuf, String> {
    let fail = |e: i32| format!("{}: {}", show(path), os_error(e));
    // SAFETY: `path` is NUL-terminated.
    let fd = unsafe { libc::open(path.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(fail(errno()));
    }
    let fd = Fd(fd);
    // SAFETY: lseek on our open descriptor.
    let size = unsafe { libc::lseek(fd.0, 0, libc::SEEK_END) };
    // SAFETY: as above.
    if size < 0 || unsafe { libc::lseek(fd.0, 0, libc::SEEK_SET) } != 0 {
        return Err(fail(errno()));
    }
    let len = usize::try_from(size).map_err(|_| format!("{}: file too large", show(path)))?;
    let mut buf = AlignedBuf::zeroed(len).ok_or_else(|| format!("{}: cannot allocate {len} bytes", show(path)))?;
    let mut done = 0;
    while done < len {
        let rest = buf.bytes_mut().get_mut(done..).unwrap_or(&mut []);
        // SAFETY: the pointer and length describe the unread tail of our buffer.
        let n = unsafe { libc::read(fd.0, rest.as_mut_ptr().cast(), rest.len()) };
        if n < 0 {
            let e = errno();
            if e == libc::EINTR {
                continue;
            }
            return Err(fail(e));
        }
        if n == 0 {
            return Err(format!("{}: file shrank while being read", show(path)));
        }
        done += n as usize;
    }
    Ok(buf)
}

/// Creates (or truncates) the file at `path` and writes `bytes` to it.
pub fn write_file(path: &CStr, bytes: &[u8]) -> Result<(), String> {
    // SAFETY: `path` is NUL-terminated; the mode is a plain permission set.
    let fd = unsafe {
        libc::open(
            path.as_ptr(),
            libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC | libc::O_CLOEXEC,
            0o644 as libc::c_uint,
        )
    };
    if fd < 0 {
        return Err(format!("{}: {}", show(path), os_error(errno())));
    }
    let fd = Fd(fd);
    write_all(fd.0, bytes).map_err(|e| format!("{}: {}", show(path), os_error(e)))
}

/// Creates the directory `path` unless it exists (its parent must).
pub fn make_dir(path: &CStr) -> Result<(), String> {
    // SAFETY: `path` is NUL-terminated.
    if unsafe { libc::mkdir(path.as_ptr(), 0o755) } != 0 {
        let e = errno();
        if e != libc::EEXIST {
            return Err(format!("{}: {}", show(path), os_error(e)));
        }
    }
    Ok(())
}
