//! Rewriting the checksums and the length a file records, so that bytes edited on
//! purpose (fuzzing, tests of the section decoders) get past the container's integrity
//! checks and reach the code behind them. Readers never call this.

use crate::format::{crc32, le_u32, le_u64, ENTRY_LEN, HEADER_LEN, MAX_SECTIONS};

/// Sets the header's file length to `data.len()` and recomputes the CRC of every
/// section that lies inside the file, of the section table and of the header. Files
/// shorter than the header are left alone; entries beyond the file are skipped.
pub fn reseal(data: &mut [u8]) {
    if data.len() < HEADER_LEN {
        return;
    }
    let len = data.len();
    data[24..32].copy_from_slice(&(len as u64).to_le_bytes());
    let count = (le_u32(data, 20) as usize).min(MAX_SECTIONS);
    let table_end = (HEADER_LEN + count * ENTRY_LEN).min(len);
    let entries = (table_end - HEADER_LEN) / ENTRY_LEN;
    for i in 0..entries {
        let e = HEADER_LEN + i * ENTRY_LEN;
        let (offset, length) = (le_u64(data, e + 8), le_u64(data, e + 16));
        if let Some(end) = offset.checked_add(length).filter(|&end| end <= len as u64) {
            let crc = crc32(&data[offset as usize..end as usize]);
            data[e + 28..e + 32].copy_from_slice(&crc.to_le_bytes());
        }
    }
    let table = crc32(&data[HEADER_LEN..table_end]);
    data[32..36].copy_from_slice(&table.to_le_bytes());
    let header = crc32(&data[..36]);
    data[36..40].copy_from_slice(&header.to_le_bytes());
}
