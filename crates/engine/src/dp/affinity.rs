//! `--cpu-affinity`: one CPU set per data-parallel engine, applied to the thread that builds
//! the engine, whose thread pool workers and engine-core thread inherit it (Linux copies the
//! creating thread's mask to a new thread).

use std::collections::BTreeSet;

use crate::EngineError;

/// Parses `0-7,8-15` (one set per engine, comma separated; within a set, ranges or single
/// CPUs joined by `+`, e.g. `0-3+8-11,4-7+12-15`).
pub fn parse_cpu_affinity(text: &str) -> Result<Vec<Vec<usize>>, EngineError> {
    let bad = |why: &str| {
        EngineError::Config(format!(
            "--cpu-affinity {text:?}: {why} (expected one CPU set per engine, e.g. 0-7,8-15; \
             ranges within a set joined by +)"
        ))
    };
    let mut sets = Vec::new();
    for set_text in text.split(',') {
        let mut set = BTreeSet::new();
        for part in set_text.split('+').map(str::trim) {
            let (first, last) = part.split_once('-').unwrap_or((part, part));
            let parse = |s: &str| {
                s.trim()
                    .parse::<usize>()
                    .map_err(|_| bad("not a CPU number"))
            };
            let (first, last) = (parse(first)?, parse(last)?);
            if first > last {
                return Err(bad("a range runs backwards"));
            }
            set.extend(first..=last);
        }
        sets.push(set.into_iter().collect());
    }
    Ok(sets)
}

/// Restricts the calling thread to `cpus`. On failure (a CPU the machine lacks, a container
/// that forbids it) the engine still runs unpinned, so this only warns.
pub(crate) fn pin_current_thread(rank: usize, cpus: &[usize]) {
    use nix::sched::{sched_setaffinity, CpuSet};
    use nix::unistd::Pid;
    let mut set = CpuSet::new();
    for &cpu in cpus {
        if let Err(error) = set.set(cpu) {
            tracing::warn!("engine {rank}: cannot pin to CPU {cpu} ({error}); running unpinned");
            return;
        }
    }
    match sched_setaffinity(Pid::from_raw(0), &set) {
        Ok(()) => tracing::info!("engine {rank}: pinned to CPUs {cpus:?}"),
        Err(error) => {
            tracing::warn!("engine {rank}: cannot pin to CPUs {cpus:?} ({error}); running unpinned")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sets_are_comma_separated_and_ranges_joined_by_plus() {
        assert_eq!(
            parse_cpu_affinity("0-3,4-7").unwrap(),
            vec![vec![0, 1, 2, 3], vec![4, 5, 6, 7]]
        );
        assert_eq!(
            parse_cpu_affinity("0-1+8, 5").unwrap(),
            vec![vec![0, 1, 8], vec![5]]
        );
        for bad in ["", "0-", "3-1", "a", "0,,1"] {
            assert!(parse_cpu_affinity(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn pinning_restricts_a_thread_and_a_bad_cpu_only_warns() {
        use nix::sched::sched_getaffinity;
        use nix::unistd::Pid;
        let allowed = |set: &nix::sched::CpuSet| {
            (0..nix::sched::CpuSet::count())
                .filter(|&cpu| set.is_set(cpu).unwrap_or(false))
                .collect::<Vec<_>>()
        };
        // The first CPU this process may use (a container may hide CPU 0).
        let first = allowed(&sched_getaffinity(Pid::from_raw(0)).unwrap())[0];
        let pinned = std::thread::spawn(move || {
            pin_current_thread(0, &[first]);
            let inherited = std::thread::spawn(|| sched_getaffinity(Pid::from_raw(0)).unwrap())
                .join()
                .unwrap();
            allowed(&inherited)
        })
        .join()
        .unwrap();
        assert_eq!(
            pinned,
            vec![first],
            "a thread started by a pinned thread inherits its set"
        );
        std::thread::spawn(|| pin_current_thread(1, &[usize::MAX]))
            .join()
            .unwrap();
    }
}
