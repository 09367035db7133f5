//! The free-block queue: a doubly linked list threaded through per-block `prev`/`next`
//! arrays, so that a prefix-cache hit can pull a free block out of the middle in O(1).

const NIL: u32 = u32::MAX;

#[derive(Debug, Clone)]
pub(crate) struct FreeBlockQueue {
    prev: Vec<u32>,
    next: Vec<u32>,
    in_queue: Vec<bool>,
    head: u32,
    tail: u32,
    len: usize,
}

impl FreeBlockQueue {
    /// A queue holding every block, in id order.
    pub(crate) fn new_full(num_blocks: u32) -> Self {
        let n = num_blocks as usize;
        let mut queue = Self {
            prev: vec![NIL; n],
            next: vec![NIL; n],
            in_queue: vec![false; n],
            head: NIL,
            tail: NIL,
            len: 0,
        };
        for block in 0..num_blocks {
            queue.push_back(block);
        }
        queue
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn contains(&self, block: u32) -> bool {
        self.in_queue.get(block as usize).copied().unwrap_or(false)
    }

    pub(crate) fn push_back(&mut self, block: u32) {
        debug_assert!(!self.contains(block));
        let i = block as usize;
        self.prev[i] = self.tail;
        self.next[i] = NIL;
        if self.tail == NIL {
            self.head = block;
        } else {
            self.next[self.tail as usize] = block;
        }
        self.tail = block;
        self.in_queue[i] = true;
        self.len += 1;
    }

    pub(crate) fn push_front(&mut self, block: u32) {
        debug_assert!(!self.contains(block));
        let i = block as usize;
        self.next[i] = self.head;
        self.prev[i] = NIL;
        if self.head == NIL {
            self.tail = block;
        } else {
            self.prev[self.head as usize] = block;
        }
        self.head = block;
        self.in_queue[i] = true;
        self.len += 1;
    }

    pub(crate) fn pop_front(&mut self) -> Option<u32> {
        if self.head == NIL {
            return None;
        }
        let block = self.head;
        self.remove(block);
        Some(block)
    }

    /// Unlinks `block`; a no-op when it is not queued.
    pub(crate) fn remove(&mut self, block: u32) {
        if !self.contains(block) {
            return;
        }
        let i = block as usize;
        let (prev, next) = (self.prev[i], self.next[i]);
        if prev == NIL {
            self.head = next;
        } else {
            self.next[prev as usize] = next;
        }
        if next == NIL {
            self.tail = prev;
        } else {
            self.prev[next as usize] = prev;
        }
        self.prev[i] = NIL;
        self.next[i] = NIL;
        self.in_queue[i] = false;
        self.len -= 1;
    }

    /// Blocks from head (next to be reused) to tail.
    pub(crate) fn iter(&self) -> impl Iterator<Item = u32> + '_ {
        let mut cursor = self.head;
        std::iter::from_fn(move || {
            if cursor == NIL {
                return None;
            }
            let block = cursor;
            cursor = self.next[block as usize];
            Some(block)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn starts_full_in_id_order() {
        let queue = FreeBlockQueue::new_full(4);
        assert_eq!(queue.iter().collect::<Vec<_>>(), vec![0, 1, 2, 3]);
        assert_eq!(queue.len(), 4);
    }

    #[test]
    fn remove_from_middle_head_and_tail() {
        let mut queue = FreeBlockQueue::new_full(5);
        queue.remove(2);
        assert_eq!(queue.iter().collect::<Vec<_>>(), vec![0, 1, 3, 4]);
        queue.remove(0);
        queue.remove(4);
        assert_eq!(queue.iter().collect::<Vec<_>>(), vec![1, 3]);
        queue.remove(4);
        assert_eq!(queue.len(), 2);
        queue.push_back(0);
        queue.push_front(4);
        assert_eq!(queue.iter().collect::<Vec<_>>(), vec![4, 1, 3, 0]);
        assert_eq!(queue.pop_front(), Some(4));
        assert_eq!(queue.pop_front(), Some(1));
        assert_eq!(queue.pop_front(), Some(3));
        assert_eq!(queue.pop_front(), Some(0));
        assert_eq!(queue.pop_front(), None);
        assert_eq!(queue.len(), 0);
        queue.push_front(2);
        assert_eq!(queue.iter().collect::<Vec<_>>(), vec![2]);
    }
}
