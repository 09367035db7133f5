//! Byte buffers that start on a cache line, for the tile kernels' B tiles and activation
//! copies (`matmul/amx.rs`, `matmul/vnni_tiles.rs`, `encoder/pair.rs`). A `Vec`'s heap block
//! is only 16-byte aligned (large ones sit 16 bytes past a page), and a 64-byte tile row or
//! 512-bit load at a 16-byte offset splits two cache lines: on the Xeon that measured 2.2x the
//! cycles of a tile load/multiply/store round and 3.4x those of a `tilestored`.

/// A reusable byte buffer whose start is 64-byte aligned; its length is whole 64-byte lines.
#[derive(Clone, Default)]
pub(crate) struct AlignedBytes(Vec<Line>);

#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([u8; 64]);

impl std::fmt::Debug for AlignedBytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "AlignedBytes({} bytes)", self.len())
    }
}

impl AlignedBytes {
    /// A zeroed buffer of at least `len` bytes.
    pub(crate) fn zeroed(len: usize) -> AlignedBytes {
        let mut buffer = AlignedBytes::default();
        buffer.resize(len);
        buffer
    }

    /// Makes room for at least `len` bytes (new bytes zero; existing ones kept).
    pub(crate) fn resize(&mut self, len: usize) {
        self.0.resize(len.div_ceil(64), Line([0; 64]));
    }

    /// Bytes held (whole lines).
    pub(crate) fn len(&self) -> usize {
        self.0.len() * 64
    }

    pub(crate) fn as_ptr(&self) -> *const u8 {
        self.0.as_ptr().cast()
    }

    pub(crate) fn as_mut_ptr(&mut self) -> *mut u8 {
        self.0.as_mut_ptr().cast()
    }

    /// The bytes as signed int8.
    pub(crate) fn as_i8(&self) -> &[i8] {
        // SAFETY: `Line`s are plain bytes laid out back to back (size 64, align 64, no
        // padding); i8 has u8's size and alignment; the slice borrows `self`.
        unsafe { std::slice::from_raw_parts(self.0.as_ptr().cast(), self.len()) }
    }

    /// The bytes as signed int8, writable.
    pub(crate) fn as_i8_mut(&mut self) -> &mut [i8] {
        let len = self.len();
        // SAFETY: as `as_i8`, borrowing `self` mutably.
        unsafe { std::slice::from_raw_parts_mut(self.0.as_mut_ptr().cast(), len) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The buffer starts on a cache line whatever its size, keeps its bytes when it grows,
    /// and its int8 views cover whole lines.
    #[test]
    fn aligned_bytes_start_on_a_line() {
        let mut buffer = AlignedBytes::default();
        for len in [1usize, 100, 512, 12_288, 40_000] {
            buffer.resize(len);
            assert_eq!(buffer.as_ptr() as usize % 64, 0, "{len} bytes");
            assert_eq!(buffer.as_mut_ptr() as usize % 64, 0, "{len} bytes");
            assert!(
                buffer.len() >= len
                    && buffer.len() % 64 == 0
                    && buffer.as_i8().len() == buffer.len()
            );
            buffer.as_i8_mut()[len - 1] = 7;
            assert_eq!(buffer.as_i8()[len - 1], 7);
        }
        assert_eq!(buffer.as_i8()[99], 7, "kept across growth");
    }

    #[test]
    fn zeroed_buffers_are_zero_and_clones_equal() {
        let buffer = AlignedBytes::zeroed(300);
        assert_eq!(buffer.len(), 320);
        assert!(buffer.as_i8().iter().all(|&b| b == 0));
        let mut copy = buffer.clone();
        copy.as_i8_mut()[5] = -3;
        assert_eq!(copy.as_ptr() as usize % 64, 0);
        assert_eq!((buffer.as_i8()[5], copy.as_i8()[5]), (0, -3));
    }
}
