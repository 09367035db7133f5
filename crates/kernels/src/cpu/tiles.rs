//! AMX tile state shared by the tile kernels (`matmul/amx.rs`: int8, `encoder/bf16.rs`:
//! bf16): the 64-byte palette-1 configuration and its release. Only called with a token that
//! proves AMX and its permission (`crate::cpu::amx_enabled`).

use std::arch::asm;

/// A 64-byte tile configuration (palette 1): per tile register its rows and bytes per row.
#[repr(C, align(64))]
pub(crate) struct TileConfig([u8; 64]);

impl TileConfig {
    /// Palette 1 with `tiles[t] = (rows, bytes per row)` for register `tmm t`; registers past
    /// `tiles.len()` stay unconfigured (0 × 0).
    pub(crate) fn new(tiles: &[(usize, usize)]) -> TileConfig {
        debug_assert!(tiles.len() <= 8);
        let mut bytes = [0u8; 64];
        bytes[0] = 1;
        for (tile, &(rows, row_bytes)) in tiles.iter().enumerate() {
            debug_assert!(rows <= 16 && row_bytes <= 64);
            bytes[16 + 2 * tile..18 + 2 * tile].copy_from_slice(&(row_bytes as u16).to_le_bytes());
            bytes[48 + tile] = rows as u8;
        }
        TileConfig(bytes)
    }

    /// Loads this configuration into the calling thread's tile registers.
    ///
    /// # Safety
    /// The CPU has AMX and the process holds the tile-data permission (an AMX token).
    #[inline]
    pub(crate) unsafe fn load(&self) {
        // SAFETY: the caller's contract; `ldtilecfg` reads the 64 bytes of `self`.
        unsafe { asm!("ldtilecfg [{0}]", in(reg) self.0.as_ptr(), options(nostack, readonly)) };
    }
}

/// Returns the thread's tile registers to their initial state.
///
/// # Safety
/// As [`TileConfig::load`].
#[inline]
pub(crate) unsafe fn release_tiles() {
    // SAFETY: the caller's contract.
    unsafe { asm!("tilerelease", options(nostack, nomem)) };
}
