//! [`WeightBuf`]: the owned, zero-initialised buffer that repacked weights live in, backed by
//! transparent huge pages where Linux allows it.
//!
//! Decoding one token streams every weight once, so a large model's matmuls run at the memory
//! system's pace, and with 4 KiB pages that pace includes a TLB miss (and a restart of the
//! hardware prefetcher's stream) every 4 KiB. A buffer of at least [`HUGE_PAGE`] bytes is
//! therefore allocated 2 MiB-aligned and advised `MADV_HUGEPAGE` *before* its pages are first
//! touched (then zeroed), so the kernel backs it with 2 MiB pages even where
//! `/sys/kernel/mm/transparent_hugepage/enabled` is `madvise` (the common default). Only whole
//! 2 MiB pages inside the buffer are advised, so no page beyond the buffer's last byte is ever
//! backed; a refused advice (no THP, another OS) only costs the speed-up.
//! [`HUGE_PAGES_ENV`]`=0` switches the advice off (for A/B timings); nothing else changes.

use std::alloc::{self, Layout};
use std::ptr::NonNull;
use std::sync::OnceLock;

use crate::KernelError;

/// Bytes of one transparent huge page on x86-64 (and the alignment of large buffers).
const HUGE_PAGE: usize = 2 << 20;

/// The environment variable that switches the huge-page advice for weight buffers off when
/// set to `0` (or `off`, `false`, `no`); read once per process.
pub const HUGE_PAGES_ENV: &str = "TOKENMILL_HUGE_PAGES";

/// Element types a [`WeightBuf`] may hold: plain data for which all-zero bytes are a valid
/// value and no drop glue exists (only the impls below).
pub(crate) trait Plain: Copy + Send + Sync + 'static {}
impl Plain for u8 {}
impl Plain for u16 {}
impl Plain for f32 {}
impl Plain for u64 {}

/// An owned `[T]` of fixed length, zero-initialised, huge-page backed when large (see the
/// module notes). Dereferences to a slice.
pub(crate) struct WeightBuf<T: Plain> {
    ptr: NonNull<T>,
    len: usize,
    /// The allocation (`size == 0`: none, `ptr` dangling).
    layout: Layout,
}

// SAFETY: a `WeightBuf` uniquely owns its allocation of plain `Send + Sync` data, like a
// `Vec<T>`; shared references only read it.
unsafe impl<T: Plain> Send for WeightBuf<T> {}
// SAFETY: as above.
unsafe impl<T: Plain> Sync for WeightBuf<T> {}

impl<T: Plain> WeightBuf<T> {
    /// `len` zeros; an error when `len` elements do not fit the address space. Aborts when
    /// the allocation fails, like any `Vec`.
    pub(crate) fn zeroed(len: usize) -> Result<WeightBuf<T>, KernelError> {
        const TOO_LARGE: KernelError = KernelError::InvalidShape("weight buffer size overflows");
        let size = len.checked_mul(size_of::<T>()).ok_or(TOO_LARGE)?;
        let align = if size >= HUGE_PAGE {
            HUGE_PAGE
        } else {
            align_of::<T>()
        };
        let layout = Layout::from_size_align(size, align).map_err(|_| TOO_LARGE)?;
        Ok(WeightBuf {
            ptr: allocate_zeroed(layout).cast(),
            len,
            layout,
        })
    }

    /// A copy of `values`.
    pub(crate) fn from_slice(values: &[T]) -> Result<WeightBuf<T>, KernelError> {
        let mut buf = WeightBuf::zeroed(values.len())?;
        buf.copy_from_slice(values);
        Ok(buf)
    }
}

/// A zeroed allocation of `layout` (dangling for size 0), advised as huge pages before its
/// first touch when 2 MiB-aligned.
fn allocate_zeroed(layout: Layout) -> NonNull<u8> {
    if layout.size() == 0 {
        // A dangling pointer aligned for `layout` (never read or written through).
        return NonNull::<u8>::dangling().with_addr(
            std::num::NonZeroUsize::new(layout.align()).unwrap_or(std::num::NonZeroUsize::MIN),
        );
    }
    // SAFETY: the layout has a non-zero size.
    let raw = unsafe { alloc::alloc(layout) };
    let Some(ptr) = NonNull::new(raw) else {
        alloc::handle_alloc_error(layout)
    };
    if layout.align() == HUGE_PAGE {
        advise_huge_pages(raw, layout.size());
    }
    // SAFETY: `raw` is a fresh allocation of `layout.size()` bytes. Zeroing is the first touch
    // of its pages, after the advice.
    unsafe { raw.write_bytes(0, layout.size()) };
    ptr
}

impl<T: Plain> Drop for WeightBuf<T> {
    fn drop(&mut self) {
        if self.layout.size() != 0 {
            // SAFETY: allocated by `allocate_zeroed` with this layout.
            unsafe { alloc::dealloc(self.ptr.as_ptr().cast(), self.layout) };
        }
    }
}

impl<T: Plain> std::ops::Deref for WeightBuf<T> {
    type Target = [T];

    fn deref(&self) -> &[T] {
        // SAFETY: `ptr` holds `len` initialised elements (zeroed at allocation; zero bytes
        // are a valid `T`, see `Plain`), or is dangling, aligned and `len * size_of::<T>()`
        // is zero, which a slice allows.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl<T: Plain> std::ops::DerefMut for WeightBuf<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        // SAFETY: as in `deref`, and `&mut self` makes this the only reference.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl<T: Plain> Clone for WeightBuf<T> {
    fn clone(&self) -> WeightBuf<T> {
        let mut copy = WeightBuf {
            ptr: allocate_zeroed(self.layout).cast(),
            len: self.len,
            layout: self.layout,
        };
        copy.copy_from_slice(self);
        copy
    }
}

impl<T: Plain> std::fmt::Debug for WeightBuf<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "WeightBuf<{}>[{}]", std::any::type_name::<T>(), self.len)
    }
}

/// Whether [`HUGE_PAGES_ENV`] leaves the advice on (read once).
fn huge_pages_wanted() -> bool {
    static WANTED: OnceLock<bool> = OnceLock::new();
    *WANTED.get_or_init(|| {
        std::env::var(HUGE_PAGES_ENV).map_or(true, |value| !crate::cpu::switched_off(&value))
    })
}

/// Advises the whole 2 MiB pages of `[start, start + size)` (`start` 2 MiB-aligned) as huge
/// pages. Failure is ignored: the buffer works the same on 4 KiB pages.
#[cfg(target_os = "linux")]
fn advise_huge_pages(start: *mut u8, size: usize) {
    let whole = size / HUGE_PAGE * HUGE_PAGE;
    if whole == 0 || !huge_pages_wanted() {
        return;
    }
    // SAFETY: `[start, start + whole)` lies inside one live allocation of ours and is
    // page-aligned; MADV_HUGEPAGE changes only how the kernel backs it, never its contents.
    let rc = unsafe { libc::madvise(start.cast(), whole, libc::MADV_HUGEPAGE) };
    if rc != 0 {
        static LOGGED: OnceLock<()> = OnceLock::new();
        LOGGED.get_or_init(|| {
            tracing::debug!(
                "weights: madvise(MADV_HUGEPAGE) refused ({}), 4 KiB pages",
                std::io::Error::last_os_error()
            );
        });
    }
}

#[cfg(not(target_os = "linux"))]
fn advise_huge_pages(_start: *mut u8, _size: usize) {
    let _ = huge_pages_wanted;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_are_zeroed_writable_cloneable_and_aligned_when_large() {
        for len in [
            0usize,
            1,
            7,
            HUGE_PAGE / 2 - 1,
            HUGE_PAGE / 2,
            3 * HUGE_PAGE / 2 + 5,
        ] {
            let mut buf = WeightBuf::<u16>::zeroed(len).unwrap();
            assert_eq!(buf.len(), len);
            assert!(buf.iter().all(|&v| v == 0));
            for (i, v) in buf.iter_mut().enumerate() {
                *v = i as u16;
            }
            let copy = buf.clone();
            assert_eq!(&copy[..], &buf[..]);
            if len * 2 >= HUGE_PAGE {
                assert_eq!(buf.as_ptr() as usize % HUGE_PAGE, 0, "len {len}");
            }
        }
        let floats = WeightBuf::from_slice(&[1.5f32, -2.0]).unwrap();
        assert_eq!(&floats[..], &[1.5, -2.0]);
        assert!(WeightBuf::<f32>::zeroed(usize::MAX / 2).is_err());
    }
}
