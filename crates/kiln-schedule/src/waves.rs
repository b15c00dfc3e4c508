//! Partition of a task DAG into waves.
//!
//! Wave `k` holds every task whose longest dependency chain from a source has
//! length `k` (as-soon-as-possible levels): tasks of one wave never depend on each
//! other, so they may run concurrently; a barrier separates consecutive waves.
//! [`waves_apart`] defers tasks of one key while another key's tasks are running.

use std::collections::BTreeMap;

/// Why a task graph cannot be scheduled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WaveError {
    /// A dependency names a task that does not exist.
    UnknownTask {
        /// The task.
        task: usize,
        /// The dependency it names.
        dep: usize,
    },
    /// The dependencies form a cycle through this task.
    Cycle(usize),
}

impl core::fmt::Display for WaveError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            WaveError::UnknownTask { task, dep } => write!(f, "task {task} depends on unknown task {dep}"),
            WaveError::Cycle(t) => write!(f, "dependency cycle through task {t}"),
        }
    }
}

/// Waves of a DAG: `waves[k]` lists task indices, in increasing order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Waves {
    /// The waves, in execution order.
    pub waves: Vec<Vec<usize>>,
    /// Wave index of each task.
    pub wave_of: Vec<usize>,
}

impl Waves {
    /// The tasks in execution order (wave by wave).
    pub fn order(&self) -> Vec<usize> {
        self.waves.iter().flatten().copied().collect()
    }
}

/// Computes the waves of tasks `0..deps.len()`, where `deps[t]` lists the tasks
/// `t` depends on.
pub fn waves(deps: &[Vec<usize>]) -> Result<Waves, WaveError> {
    waves_apart(deps, &vec![None; deps.len()])
}

/// Waves of tasks `0..deps.len()` as [`waves`] forms them, except that tasks marked
/// with a key (a large constant each of them reads again and again: the recurrent
/// weights of one direction of an unrolled recurrence) run one key at a time. Once a
/// task of a key runs, tasks of other keys wait until every task of that key has run,
/// so the bytes behind one key stay in cache while its tasks run; a key's tasks
/// interleaved with another's (the forward and the reverse steps of a bidirectional
/// LSTM, each direction's weights over half a last-level cache) would evict each other
/// at every step. Unmarked tasks run as soon as they can. Where only tasks of other
/// keys are ready (the open key's next task waits on them), the lowest-numbered one's
/// key opens instead, so every wave runs at least one task. Without keys the waves are
/// as-soon-as-possible levels: wave `k` is the tasks whose longest chain is `k`.
pub fn waves_apart(deps: &[Vec<usize>], keys: &[Option<usize>]) -> Result<Waves, WaveError> {
    let n = deps.len();
    // Tasks of each key not yet in a wave.
    let mut left: BTreeMap<usize, usize> = BTreeMap::new();
    for &k in keys.iter().take(n).flatten() {
        *left.entry(k).or_default() += 1;
    }
    let key = |t: usize| keys.get(t).copied().flatten();
    let mut open: Option<usize> = None;
    let mut users = vec![Vec::new(); n];
    let mut pending = vec![0usize; n];
    for (t, ds) in deps.iter().enumerate() {
        for &d in ds {
            if d >= n {
                return Err(WaveError::UnknownTask { task: t, dep: d });
            }
            users[d].push(t);
            pending[t] += 1;
        }
    }
    let mut wave_of = vec![0usize; n];
    let mut ready: Vec<usize> = (0..n).filter(|&t| pending[t] == 0).collect();
    let mut waves = Vec::new();
    let mut done = 0;
    while !ready.is_empty() {
        // The key this wave may run: the open one, else (none open, or only other
        // keys' tasks ready) the first ready keyed task's.
        let runs = |t: usize, open: Option<usize>| key(t).is_none() || key(t) == open;
        if open.is_none() || !ready.iter().any(|&t| runs(t, open)) {
            open = ready.iter().find_map(|&t| key(t));
        }
        let (current, waiting): (Vec<usize>, Vec<usize>) = ready.iter().partition(|&&t| runs(t, open));
        let mut next = waiting;
        for &t in &current {
            wave_of[t] = waves.len();
            if let Some(c) = key(t).and_then(|k| left.get_mut(&k)) {
                *c -= 1;
            }
            for &u in &users[t] {
                pending[u] -= 1;
                if pending[u] == 0 {
                    next.push(u);
                }
            }
        }
        if open.is_some_and(|k| left.get(&k) == Some(&0)) {
            open = None;
        }
        done += current.len();
        next.sort_unstable();
        waves.push(current);
        ready = next;
    }
    if done != n {
        let t = (0..n).find(|&t| pending[t] > 0).unwrap_or(0);
        return Err(WaveError::Cycle(t));
    }
    Ok(Waves { waves, wave_of })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn diamond() {
        // 0 → {1, 2} → 3, and 4 independent.
        let w = waves(&[vec![], vec![0], vec![0], vec![1, 2], vec![]]).unwrap();
        assert_eq!(w.waves, vec![vec![0, 4], vec![1, 2], vec![3]]);
        assert_eq!(w.wave_of, vec![0, 1, 1, 2, 0]);
        assert_eq!(w.order(), vec![0, 4, 1, 2, 3]);
    }

    #[test]
    fn longest_chain_decides_the_wave() {
        // 3 depends on 0 directly and on 2 (0 → 1 → 2): wave 3.
        let w = waves(&[vec![], vec![0], vec![1], vec![0, 2]]).unwrap();
        assert_eq!(w.wave_of, vec![0, 1, 2, 3]);
    }

    #[test]
    fn keyed_chains_run_one_after_the_other() {
        // Two chains 0 → 2 → 4 (key 7) and 1 → 3 → 5 (key 9), each step followed by an
        // unkeyed task (6 after 2, 8 after 3): the first key's chain runs to its end,
        // its unkeyed tasks as soon as they can, then the second.
        let deps = [vec![], vec![], vec![0], vec![1], vec![2], vec![3], vec![2], vec![], vec![3]];
        let keys = [Some(7), Some(9), Some(7), Some(9), Some(7), Some(9), None, None, None];
        let w = waves_apart(&deps, &keys).unwrap();
        assert_eq!(w.waves, vec![vec![0, 7], vec![2], vec![4, 6], vec![1], vec![3], vec![5, 8]]);
        for (t, ds) in deps.iter().enumerate() {
            assert!(ds.iter().all(|&d| w.wave_of[d] < w.wave_of[t]), "task {t} after its dependencies");
        }
        // Without keys: as-soon-as-possible levels.
        assert_eq!(waves_apart(&deps, &[None; 9]).unwrap(), waves(&deps).unwrap());
        assert_eq!(waves(&deps).unwrap().waves, vec![vec![0, 1, 7], vec![2, 3], vec![4, 5, 6, 8]]);
    }

    #[test]
    fn a_key_waiting_on_another_gives_way() {
        // Key 1's second task (2) needs key 2's task (1): with only 1 ready, key 2
        // opens, then key 1 again.
        let deps = [vec![], vec![], vec![0, 1]];
        let keys = [Some(1), Some(2), Some(1)];
        let w = waves_apart(&deps, &keys).unwrap();
        assert_eq!(w.waves, vec![vec![0], vec![1], vec![2]]);
        assert_eq!(waves_apart(&[vec![1], vec![0]], &[Some(0), Some(1)]), Err(WaveError::Cycle(0)));
    }

    #[test]
    fn errors() {
        assert_eq!(waves(&[vec![1], vec![0]]), Err(WaveError::Cycle(0)));
        assert_eq!(waves(&[vec![5]]), Err(WaveError::UnknownTask { task: 0, dep: 5 }));
        assert_eq!(waves(&[]).unwrap().waves, Vec::<Vec<usize>>::new());
    }
}
