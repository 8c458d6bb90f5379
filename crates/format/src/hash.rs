//! The hash of stepscope's per-event tables (the trace summarizer's names, lanes and threads;
//! the op table's rows and correlation ids): FxHash's word-at-a-time multiply, several times
//! cheaper than the standard library's keyed SipHash on keys of a few dozen bytes or one
//! integer, looked up once per event. Unkeyed: a trace whose names were chosen to collide would
//! make its own reading slower, never wrong, in a process of its reader's own. A leaf.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// FxHash's mixing, over 8-byte words.
#[derive(Default, Clone, Copy)]
pub struct FastHasher(u64);

/// A map under [`FastHasher`].
pub type FastMap<K, V> = HashMap<K, V, BuildHasherDefault<FastHasher>>;

impl FastHasher {
    #[inline(always)]
    fn mix(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(0x517c_c1b7_2722_0a95);
    }
}

impl Hasher for FastHasher {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        let mut words = bytes.chunks_exact(8);
        for w in &mut words {
            let mut b = [0u8; 8];
            b.copy_from_slice(w);
            self.mix(u64::from_le_bytes(b));
        }
        let rest = words.remainder();
        if !rest.is_empty() {
            let mut b = [0u8; 8];
            b[..rest.len()].copy_from_slice(rest);
            self.mix(u64::from_le_bytes(b));
        }
    }

    #[inline]
    fn write_u8(&mut self, i: u8) {
        self.mix(u64::from(i));
    }

    #[inline]
    fn write_u64(&mut self, i: u64) {
        self.mix(i);
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_map_under_it_finds_what_it_holds() {
        let mut m: FastMap<(String, bool), u64> = FastMap::default();
        for i in 0..1000u64 {
            m.insert((format!("aten::op_{i}"), i % 2 == 0), i);
        }
        let mut ids: FastMap<u64, u64> = FastMap::default();
        for i in 0..1000u64 {
            ids.insert(i << 20, i);
        }
        for i in 0..1000u64 {
            assert_eq!(m.get(&(format!("aten::op_{i}"), i % 2 == 0)), Some(&i));
            assert_eq!(ids.get(&(i << 20)), Some(&i));
        }
        assert_eq!(m.get(&("aten::op_1".to_string(), true)), None);
    }
}
