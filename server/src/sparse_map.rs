//! Hash maps that give their room back: a table grows with the peak number of entries and
//! a hash map never shrinks by itself, so after 10,000 sessions ended it would keep half
//! a megabyte that `malloc_trim` cannot release.

use std::collections::HashMap;

/// Below this capacity a map is never shrunk: a few KiB, not worth a rehash.
pub(crate) const MIN_SHRUNK_CAPACITY: usize = 64;

/// Gives back `map`'s room once it is mostly empty: it is shrunk to twice what it holds
/// when under a quarter full, so a mass close costs a few rehashes of shrinking tables,
/// and a steady count never rehashes.
pub(crate) fn shrink_when_sparse<K: Eq + std::hash::Hash, V>(map: &mut HashMap<K, V>) {
    let capacity = map.capacity();
    if capacity > MIN_SHRUNK_CAPACITY && map.len() < capacity / 4 {
        map.shrink_to((map.len() * 2).max(MIN_SHRUNK_CAPACITY));
    }
}
