//! The waiting queue, ordered by the scheduling policy.
//!
//! One ordered set serves both policies: under FCFS the key is a sequence number (new requests
//! count up at the back, preempted ones count down at the front); under priority it is
//! `(priority, arrival_seq)`, so a preempted request simply returns to its place.

use std::collections::BTreeSet;

use crate::request::{Request, RequestId};

/// How waiting requests are ordered and which running request is preempted first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SchedulingPolicy {
    /// First come, first served; the most recently admitted request is preempted first.
    #[default]
    Fcfs,
    /// Lowest `priority` value first, then earliest `arrival_seq`; the request with the largest
    /// `(priority, arrival_seq)` is preempted first.
    Priority,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct QueueKey {
    primary: i64,
    order: i128,
    request_id: RequestId,
}

#[derive(Debug, Clone)]
pub(crate) struct WaitingQueue {
    policy: SchedulingPolicy,
    entries: BTreeSet<QueueKey>,
    next_back: i128,
    next_front: i128,
}

impl WaitingQueue {
    pub(crate) fn new(policy: SchedulingPolicy) -> Self {
        Self {
            policy,
            entries: BTreeSet::new(),
            next_back: 0,
            next_front: -1,
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    /// Queues a new arrival.
    pub(crate) fn push_back(&mut self, request: &Request) -> QueueKey {
        let key = match self.policy {
            SchedulingPolicy::Fcfs => {
                self.next_back += 1;
                QueueKey {
                    primary: 0,
                    order: self.next_back,
                    request_id: request.request_id,
                }
            }
            SchedulingPolicy::Priority => Self::priority_key(request),
        };
        self.entries.insert(key);
        key
    }

    /// Queues a preempted request ahead of everything else its policy allows.
    pub(crate) fn push_front(&mut self, request: &Request) -> QueueKey {
        let key = match self.policy {
            SchedulingPolicy::Fcfs => {
                self.next_front -= 1;
                QueueKey {
                    primary: 0,
                    order: self.next_front,
                    request_id: request.request_id,
                }
            }
            SchedulingPolicy::Priority => Self::priority_key(request),
        };
        self.entries.insert(key);
        key
    }

    fn priority_key(request: &Request) -> QueueKey {
        QueueKey {
            primary: i64::from(request.priority),
            order: i128::from(request.arrival_seq),
            request_id: request.request_id,
        }
    }

    pub(crate) fn peek(&self) -> Option<RequestId> {
        self.entries.first().map(|key| key.request_id)
    }

    pub(crate) fn remove(&mut self, key: &QueueKey) -> bool {
        self.entries.remove(key)
    }

    /// Request ids from the next to be admitted to the last.
    pub(crate) fn ids(&self) -> impl Iterator<Item = RequestId> + '_ {
        self.entries.iter().map(|key| key.request_id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(id: u64, priority: i32, arrival_seq: u64) -> Request {
        Request {
            priority,
            arrival_seq,
            ..Request::new(RequestId(id), vec![1], 1)
        }
    }

    #[test]
    fn fcfs_appends_and_preempted_go_first() {
        let mut queue = WaitingQueue::new(SchedulingPolicy::Fcfs);
        queue.push_back(&request(1, 5, 9));
        queue.push_back(&request(2, -5, 1));
        queue.push_front(&request(3, 0, 0));
        queue.push_front(&request(4, 0, 0));
        assert_eq!(
            queue.ids().collect::<Vec<_>>(),
            vec![RequestId(4), RequestId(3), RequestId(1), RequestId(2)]
        );
    }

    #[test]
    fn priority_orders_by_value_then_arrival() {
        let mut queue = WaitingQueue::new(SchedulingPolicy::Priority);
        let a = queue.push_back(&request(1, 5, 1));
        queue.push_back(&request(2, -5, 3));
        queue.push_back(&request(3, -5, 2));
        queue.push_front(&request(4, 10, 0));
        assert_eq!(
            queue.ids().collect::<Vec<_>>(),
            vec![RequestId(3), RequestId(2), RequestId(1), RequestId(4)]
        );
        assert!(queue.remove(&a));
        assert!(!queue.remove(&a));
        assert_eq!(queue.len(), 3);
        assert_eq!(queue.peek(), Some(RequestId(3)));
    }
}
