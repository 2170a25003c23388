//! Small helpers the parts share for their saved state (`state.rs`): how a part
//! writes bytes into JSON and reads them back, and the checks every part makes.
//!
//! A part's saved record is plain data. `check` decodes it and refuses what this
//! controller could not have reached, saying why; a part restores only what was
//! checked, and cannot fail then.

/// `b` as lowercase hex digits.
pub(crate) fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// `len` bytes from the hex digits `s`, or why not.
pub(crate) fn unhex(s: &str, len: usize) -> Result<Vec<u8>, String> {
    let bad = || format!("{s:?} is not {len} bytes of hex");
    if s.len() != len * 2 || !s.is_ascii() {
        return Err(bad());
    }
    (0..len).map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).map_err(|_| bad())).collect()
}

/// True if an item occurs twice.
pub(crate) fn has_duplicates<T: Ord>(items: impl Iterator<Item = T>) -> bool {
    let mut v: Vec<T> = items.collect();
    let n = v.len();
    v.sort();
    v.dedup();
    v.len() != n
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_round_trips_and_refuses_what_is_not_hex() {
        let b = [0u8, 0x7f, 0xff, 0x10];
        assert_eq!(unhex(&hex(&b), 4).unwrap(), b);
        assert!(unhex("0g", 1).is_err());
        assert!(unhex("00", 2).is_err());
        // A state from a hostile peer: a multi-byte character across a byte's two
        // digits is refused, not sliced through (which would panic).
        assert!(unhex("a\u{e9}b", 2).is_err());
        assert!(unhex("\u{e9}\u{e9}", 2).is_err());
    }
}
