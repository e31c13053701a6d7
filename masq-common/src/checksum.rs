//! Internet checksum arithmetic (RFC 1071, incremental updates per RFC 1624).
//!
//! The datapath leaves TCP and UDP checksums to the kernel's `bpf_l4_csum_replace`, which knows
//! how the skb carries them (offloaded, or summed by the receiving device). The IPv4 header
//! checksum, ICMP checksums and every field embedded in an ICMP error (the quoted packet's
//! addresses, ports and checksums) are computed in software and never offloaded, so they are
//! updated with these functions. All values are the 16-bit words as they sit in the packet, read as
//! big-endian numbers.

/// Folds a 32-bit one's complement accumulator into 16 bits.
#[inline(always)]
const fn fold(mut sum: u32) -> u16 {
    sum = (sum & 0xffff) + (sum >> 16);
    sum = (sum & 0xffff) + (sum >> 16);
    sum as u16
}

/// Updates checksum `check` for a 16-bit word changing from `old` to `new` (RFC 1624 eqn. 3).
#[inline(always)]
pub const fn replace16(check: u16, old: u16, new: u16) -> u16 {
    !fold((!check) as u32 + (!old) as u32 + new as u32)
}

/// Updates checksum `check` for a 32-bit field (two words) changing from `old` to `new`.
#[inline(always)]
pub const fn replace32(check: u16, old: [u8; 4], new: [u8; 4]) -> u16 {
    let check = replace16(
        check,
        u16::from_be_bytes([old[0], old[1]]),
        u16::from_be_bytes([new[0], new[1]]),
    );
    replace16(
        check,
        u16::from_be_bytes([old[2], old[3]]),
        u16::from_be_bytes([new[2], new[3]]),
    )
}

/// Like [`replace16`] for a UDP checksum, where zero means "no checksum": zero stays zero, and a
/// computed zero is sent as 0xffff.
#[inline(always)]
pub const fn replace16_udp(check: u16, old: u16, new: u16) -> u16 {
    if check == 0 {
        return 0;
    }
    match replace16(check, old, new) {
        0 => 0xffff,
        value => value,
    }
}

/// Like [`replace32`] for a UDP checksum (see [`replace16_udp`]).
#[inline(always)]
pub const fn replace32_udp(check: u16, old: [u8; 4], new: [u8; 4]) -> u16 {
    if check == 0 {
        return 0;
    }
    match replace32(check, old, new) {
        0 => 0xffff,
        value => value,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One's complement sum of `data` (big-endian 16-bit words, odd trailing byte padded with
    /// zero), added to `initial`, not folded: the full computation the incremental updates are
    /// checked against.
    fn sum_words(initial: u32, data: &[u8]) -> u32 {
        let mut sum = u64::from(initial);
        let mut chunks = data.chunks_exact(2);
        for pair in &mut chunks {
            sum += u64::from(u16::from_be_bytes([pair[0], pair[1]]));
        }
        if let [last] = chunks.remainder() {
            sum += u64::from(u16::from_be_bytes([*last, 0]));
        }
        while sum > 0xffff_ffff {
            sum = (sum & 0xffff_ffff) + (sum >> 32);
        }
        sum as u32
    }

    /// The checksum of `data`: the complement of its folded one's complement sum.
    fn checksum(data: &[u8]) -> u16 {
        !fold(sum_words(0, data))
    }

    /// A 20-byte IPv4 header with its checksum field zeroed.
    const HEADER: [u8; 20] = [
        0x45, 0x00, 0x00, 0x54, 0x1c, 0x46, 0x40, 0x00, 0x40, 0x01, 0x00, 0x00, 0x0a, 0xf4, 0x01,
        0x05, 0xcb, 0x00, 0x71, 0x0a,
    ];

    fn with_checksum(mut header: [u8; 20]) -> [u8; 20] {
        header[10..12].copy_from_slice(&[0, 0]);
        let check = checksum(&header);
        header[10..12].copy_from_slice(&check.to_be_bytes());
        header
    }

    #[test]
    fn full_checksum_verifies_to_zero() {
        let header = with_checksum(HEADER);
        assert_eq!(checksum(&header), 0);
    }

    #[test]
    fn incremental_update_matches_recomputation() {
        let before = with_checksum(HEADER);
        let old_check = u16::from_be_bytes([before[10], before[11]]);
        let new_source = [192, 0, 2, 1];
        let mut after = before;
        after[12..16].copy_from_slice(&new_source);
        let incremental = replace32(old_check, [10, 244, 1, 5], new_source);
        let recomputed = with_checksum(after);
        assert_eq!(
            incremental,
            u16::from_be_bytes([recomputed[10], recomputed[11]])
        );
    }

    #[test]
    fn exhaustive_word_replacement_is_consistent() {
        // Any word change applied incrementally must verify like a full recomputation.
        let data = [0x12, 0x34, 0xab, 0xcd, 0xff, 0xff];
        let check = checksum(&data);
        for new in [0x0000u16, 0x0001, 0x7fff, 0xfffe, 0xffff] {
            let mut changed = data;
            changed[2..4].copy_from_slice(&new.to_be_bytes());
            let updated = replace16(check, 0xabcd, new);
            let mut packet = changed.to_vec();
            packet.extend_from_slice(&updated.to_be_bytes());
            assert_eq!(fold(sum_words(0, &packet)), 0xffff, "word {new:#x}");
        }
    }

    #[test]
    fn udp_zero_checksum_is_preserved_and_never_produced() {
        assert_eq!(replace16_udp(0, 1, 2), 0, "no checksum stays no checksum");
        assert_eq!(replace32_udp(0, [1, 2, 3, 4], [5, 6, 7, 8]), 0);
        // ~0xffff + ~0x0000 + 0xffff folds to 0xffff, so the plain update yields zero...
        assert_eq!(replace16(0xffff, 0x0000, 0xffff), 0);
        // ...which UDP must transmit as 0xffff, its other representation of zero.
        assert_eq!(replace16_udp(0xffff, 0x0000, 0xffff), 0xffff);
        assert_eq!(
            replace16_udp(0x1234, 0x0001, 0x0002),
            replace16(0x1234, 0x0001, 0x0002)
        );
    }
}
