//! A list that each reload changes in a few places: see [`ChunkedList`].

use std::{fmt, iter::FusedIterator, ops::Range, sync::Arc};

/// Entries per chunk: small enough that a change copies little, large enough that a walk over
/// the list is a walk over slices.
const CHUNK: usize = 256;

/// A list kept in chunks behind shared pointers. A copy with a few entries replaced
/// ([`ChunkedList::spliced`]) shares every chunk the change does not touch: replacing one of a
/// config's 10,000 CIDRs copies one chunk, and dropping the old config frees one chunk, where
/// a `Vec` would copy and free all 10,000 (half of what a reload cost). Two lists that share
/// their chunks compare equal without looking at the entries.
///
/// No chunk is empty, and chunks stay near [`CHUNK`] entries: a splice that leaves a small
/// chunk merges it with a neighbour.
#[derive(Clone)]
pub struct ChunkedList<T> {
    chunks: Vec<Arc<[T]>>,
    len: usize,
}

impl<T> ChunkedList<T> {
    /// An empty list.
    pub const fn new() -> Self {
        Self {
            chunks: Vec::new(),
            len: 0,
        }
    }

    /// How many entries.
    pub const fn len(&self) -> usize {
        self.len
    }

    /// Whether there is none.
    pub const fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The entries, in order.
    pub fn iter(&self) -> Iter<'_, T> {
        Iter {
            chunks: self.chunks.iter(),
            current: [].iter(),
            remaining: self.len,
        }
    }

    /// The first entry.
    pub fn first(&self) -> Option<&T> {
        self.chunks.first().and_then(|chunk| chunk.first())
    }

    /// The entry at `index`.
    pub fn get(&self, mut index: usize) -> Option<&T> {
        for chunk in &self.chunks {
            match chunk.get(index) {
                Some(entry) => return Some(entry),
                None => index -= chunk.len(),
            }
        }
        None
    }
}

impl<T: Clone> ChunkedList<T> {
    /// A copy of the list with the entries in `range` replaced by `replacement` (an empty
    /// range inserts, an empty replacement removes). Chunks the range does not touch are
    /// shared with this list; a range that ends past the list is cut at its end.
    pub fn spliced(&self, range: Range<usize>, replacement: impl IntoIterator<Item = T>) -> Self {
        let end = range.end.min(self.len);
        let start = range.start.min(end);
        let mut chunks = Vec::with_capacity(self.chunks.len() + 2);
        // Chunks that end before the range are kept as they are.
        let (mut next, mut offset) = (0, 0);
        while let Some(chunk) = self.chunks.get(next)
            && offset + chunk.len() <= start
        {
            chunks.push(Arc::clone(chunk));
            offset += chunk.len();
            next += 1;
        }
        // The chunk that holds the start of the range and the others up to its end are
        // rebuilt: their entries before the range, the replacement, their entries after it.
        let first_touched = next;
        let mut touched_end = offset;
        while let Some(chunk) = self.chunks.get(next)
            && (next == first_touched || touched_end < end)
        {
            touched_end += chunk.len();
            next += 1;
        }
        let touched = self.chunks.get(first_touched..next).unwrap_or_default();
        let old = touched.iter().flat_map(|chunk| chunk.iter());
        let mut rebuilt = Vec::with_capacity(touched_end - offset + CHUNK);
        rebuilt.extend(old.clone().take(start - offset).cloned());
        rebuilt.extend(replacement);
        rebuilt.extend(old.skip(end - offset).cloned());
        // A small remainder joins a neighbour, so that chunks do not dwindle over many
        // changes: the next chunk, or else the last one kept.
        if rebuilt.len() < CHUNK / 2 {
            if let Some(following) = self.chunks.get(next) {
                rebuilt.extend(following.iter().cloned());
                next += 1;
            } else if let Some(preceding) = chunks.pop() {
                rebuilt.splice(0..0, preceding.iter().cloned());
            }
        }
        let pieces = rebuilt.len().div_ceil(CHUNK);
        let mut rebuilt = rebuilt.into_iter();
        for piece in 0..pieces {
            // Even pieces: CHUNK + 2 entries become two halves, not CHUNK and 2.
            let size = rebuilt.len() / (pieces - piece);
            chunks.push(rebuilt.by_ref().take(size).collect());
        }
        chunks.extend(self.chunks.get(next..).unwrap_or_default().iter().cloned());
        let len = chunks.iter().map(|chunk| chunk.len()).sum();
        Self { chunks, len }
    }
}

impl<T> Default for ChunkedList<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T> From<Vec<T>> for ChunkedList<T> {
    fn from(entries: Vec<T>) -> Self {
        let len = entries.len();
        let mut entries = entries.into_iter();
        let mut chunks = Vec::with_capacity(len.div_ceil(CHUNK));
        while entries.len() > 0 {
            chunks.push(entries.by_ref().take(CHUNK).collect());
        }
        Self { chunks, len }
    }
}

impl<T> FromIterator<T> for ChunkedList<T> {
    fn from_iter<I: IntoIterator<Item = T>>(entries: I) -> Self {
        Vec::from_iter(entries).into()
    }
}

impl<T: PartialEq> PartialEq for ChunkedList<T> {
    fn eq(&self, other: &Self) -> bool {
        if self.len != other.len {
            return false;
        }
        let same_layout = self.chunks.len() == other.chunks.len()
            && self
                .chunks
                .iter()
                .zip(&other.chunks)
                .all(|(ours, theirs)| ours.len() == theirs.len());
        if same_layout {
            self.chunks
                .iter()
                .zip(&other.chunks)
                .all(|(ours, theirs)| Arc::ptr_eq(ours, theirs) || ours[..] == theirs[..])
        } else {
            self.iter().eq(other.iter())
        }
    }
}

impl<T: Eq> Eq for ChunkedList<T> {}

impl<T: fmt::Debug> fmt::Debug for ChunkedList<T> {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.debug_list().entries(self.iter()).finish()
    }
}

impl<'list, T> IntoIterator for &'list ChunkedList<T> {
    type Item = &'list T;
    type IntoIter = Iter<'list, T>;

    fn into_iter(self) -> Iter<'list, T> {
        self.iter()
    }
}

/// The entries of a [`ChunkedList`], in order.
#[derive(Clone, Debug)]
pub struct Iter<'list, T> {
    chunks: std::slice::Iter<'list, Arc<[T]>>,
    current: std::slice::Iter<'list, T>,
    remaining: usize,
}

impl<T> Default for Iter<'_, T> {
    fn default() -> Self {
        Self {
            chunks: [].iter(),
            current: [].iter(),
            remaining: 0,
        }
    }
}

impl<'list, T> Iterator for Iter<'list, T> {
    type Item = &'list T;

    fn next(&mut self) -> Option<&'list T> {
        loop {
            if let Some(entry) = self.current.next() {
                self.remaining -= 1;
                return Some(entry);
            }
            self.current = self.chunks.next()?.iter();
        }
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.remaining, Some(self.remaining))
    }

    fn fold<B, F: FnMut(B, &'list T) -> B>(self, init: B, mut fold: F) -> B {
        let init = self.current.fold(init, &mut fold);
        self.chunks
            .fold(init, |acc, chunk| chunk.iter().fold(acc, &mut fold))
    }
}

impl<T> ExactSizeIterator for Iter<'_, T> {}

impl<T> FusedIterator for Iter<'_, T> {}

#[cfg(test)]
mod tests {
    use super::*;

    /// Checks the list against the `Vec` it models, and its invariants.
    fn check(list: &ChunkedList<u32>, model: &[u32]) {
        assert_eq!(list.len(), model.len());
        assert_eq!(list.iter().len(), model.len());
        assert!(list.iter().eq(model.iter()), "{list:?} != {model:?}");
        assert_eq!(list.iter().copied().sum::<u32>(), model.iter().sum());
        assert_eq!(list.first(), model.first());
        for (index, entry) in model.iter().enumerate() {
            assert_eq!(list.get(index), Some(entry));
        }
        assert_eq!(list.get(model.len()), None);
        assert!(list.chunks.iter().all(|chunk| !chunk.is_empty()));
        assert_eq!(*list, ChunkedList::from(model.to_vec()));
    }

    #[test]
    fn splices_like_a_vec_and_shares_what_it_does_not_touch() {
        let model: Vec<u32> = (0..1000).collect();
        let list = ChunkedList::from(model.clone());
        check(&list, &model);
        for (range, replacement) in [
            (0..0, vec![7, 8]),
            (0..1, vec![]),
            (0..1, vec![9]),
            (500..501, vec![1, 2, 3]),
            (255..257, vec![]),
            (256..256, vec![5]),
            (999..1000, vec![4]),
            (1000..1000, vec![6]),
            (0..1000, vec![1]),
            (10..900, vec![]),
            (2000..3000, vec![11]),
        ] {
            let spliced = list.spliced(range.clone(), replacement.clone());
            let mut expected = model.clone();
            let end = range.end.min(model.len());
            expected.splice(range.start.min(end)..end, replacement);
            check(&spliced, &expected);
            let shared = spliced
                .chunks
                .iter()
                .filter(|chunk| list.chunks.iter().any(|old| Arc::ptr_eq(old, chunk)))
                .count();
            if range.len() <= 3 {
                assert!(shared + 2 >= list.chunks.len(), "{range:?} shared {shared}");
            }
        }
    }

    #[test]
    fn chains_of_changes_keep_chunks_near_their_size() {
        let mut model: Vec<u32> = (0..3000).collect();
        let mut list = ChunkedList::from(model.clone());
        // A fixed pseudo-random walk: removals, insertions and replacements anywhere.
        let mut state = 0x2545_f491_u32;
        for step in 0..2000 {
            state ^= state << 13;
            state ^= state >> 17;
            state ^= state << 5;
            let at = state as usize % (model.len() + 1);
            let (removed, added) = match step % 3 {
                0 => (0, 1),
                1 => (1, 0),
                _ => (1, 1),
            };
            let end = (at + removed).min(model.len());
            model.splice(at..end, std::iter::repeat_n(step, added));
            list = list.spliced(at..end, std::iter::repeat_n(step, added));
        }
        check(&list, &model);
        let smallest = list.chunks.iter().map(|chunk| chunk.len()).min();
        assert!(smallest >= Some(CHUNK / 4), "chunks dwindled: {smallest:?}");
        assert!(list.chunks.iter().all(|chunk| chunk.len() <= 2 * CHUNK));
    }

    #[test]
    fn equal_lists_compare_equal_whatever_their_chunks() {
        let list = ChunkedList::from((0..600).collect::<Vec<u32>>());
        let moved = list.spliced(0..1, [0, 1000]).spliced(1..2, []);
        assert_ne!(moved.chunks.len(), 0);
        assert_eq!(list, moved);
        assert_ne!(list, list.spliced(599..600, [1]));
        assert_ne!(list, list.spliced(599..600, []));
        assert_eq!(ChunkedList::<u32>::new(), ChunkedList::from(Vec::new()));
        // Chunks of the same sizes, one of them different.
        let full = ChunkedList::from((0..2 * CHUNK as u32).collect::<Vec<_>>());
        let changed = full.spliced(0..1, [99]);
        assert_eq!(changed.chunks.len(), full.chunks.len());
        assert_ne!(full, changed);
    }
}
