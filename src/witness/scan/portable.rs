//! The portable scan.

use super::segment_fast;

/// How many entries are scanned between checks for a full mask.
pub(super) const CHUNK: usize = 128;

pub(super) fn occupancy_scalar(row: &[i32], ratio: f64, s_last: i32, full: u64) -> u64 {
    let mut mask = 0u64;
    for chunk in row.chunks(CHUNK) {
        for &x in chunk {
            if x >= 0 {
                mask |= 1u64 << segment_fast(x, ratio, s_last);
            }
        }
        if mask & full == full {
            break;
        }
    }
    mask
}
