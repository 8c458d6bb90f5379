//! The request log's id table: open addressing over slot indices (linear probing, deletion by
//! backward shift), keyed by each slot's hash. Allocated once; no allocation after.

/// An empty entry.
pub(super) const NONE: u32 = u32::MAX;

/// Slot indices by hash, twice as many entries as slots (a load of at most one half).
pub(super) struct IdTable {
    entries: Box<[u32]>,
}

impl IdTable {
    /// A table for `slots` slots (a power of two).
    pub(super) fn new(slots: usize) -> Self {
        IdTable {
            entries: vec![NONE; slots * 2].into_boxed_slice(),
        }
    }

    fn mask(&self) -> usize {
        self.entries.len() - 1
    }

    /// Its memory, bytes.
    pub(super) fn memory_bytes(&self) -> usize {
        std::mem::size_of_val(&*self.entries)
    }

    /// The slot of `hash` that `matches` accepts.
    pub(super) fn find(&self, hash: u64, matches: impl Fn(usize) -> bool) -> Option<usize> {
        let mask = self.mask();
        let mut i = (hash as usize) & mask;
        loop {
            let at = self.entries[i];
            if at == NONE {
                return None;
            }
            if matches(at as usize) {
                return Some(at as usize);
            }
            i = (i + 1) & mask;
        }
    }

    /// Enters slot `at` under `hash`.
    pub(super) fn insert(&mut self, hash: u64, at: usize) {
        let mask = self.mask();
        let mut i = (hash as usize) & mask;
        while self.entries[i] != NONE {
            i = (i + 1) & mask;
        }
        self.entries[i] = at as u32;
    }

    /// Takes slot `at` (entered under `hash`) out: the entries after it in its probe run move
    /// up, so that every lookup still finds its entry. `hash_of` gives a slot's hash.
    pub(super) fn remove(&mut self, hash: u64, at: usize, hash_of: impl Fn(usize) -> u64) {
        let mask = self.mask();
        let mut i = (hash as usize) & mask;
        while self.entries[i] != at as u32 {
            if self.entries[i] == NONE {
                return;
            }
            i = (i + 1) & mask;
        }
        let mut hole = i;
        let mut j = i;
        loop {
            j = (j + 1) & mask;
            let e = self.entries[j];
            if e == NONE {
                break;
            }
            let home = (hash_of(e as usize) as usize) & mask;
            // Move e into the hole unless its home lies cyclically in (hole, j].
            let stays = if hole <= j {
                hole < home && home <= j
            } else {
                hole < home || home <= j
            };
            if !stays {
                self.entries[hole] = e;
                hole = j;
            }
        }
        self.entries[hole] = NONE;
    }
}
