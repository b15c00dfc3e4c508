//! Partition of a task DAG into waves.
//!
//! Wave `k` holds every task whose longest dependency chain from a source has
//! length `k` (as-soon-as-possible levels): tasks of one wave never depend on each
//! other, so they may run concurrently; a barrier separates consecutive waves.

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
    let n = deps.len();
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
    let mut current: Vec<usize> = (0..n).filter(|&t| pending[t] == 0).collect();
    let mut waves = Vec::new();
    let mut done = 0;
    while !current.is_empty() {
        let mut next = Vec::new();
        for &t in &current {
            for &u in &users[t] {
                pending[u] -= 1;
                if pending[u] == 0 {
                    wave_of[u] = waves.len() + 1;
                    next.push(u);
                }
            }
        }
        done += current.len();
        next.sort_unstable();
        waves.push(std::mem::take(&mut current));
        current = next;
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
    fn errors() {
        assert_eq!(waves(&[vec![1], vec![0]]), Err(WaveError::Cycle(0)));
        assert_eq!(waves(&[vec![5]]), Err(WaveError::UnknownTask { task: 0, dep: 5 }));
        assert_eq!(waves(&[]).unwrap().waves, Vec::<Vec<usize>>::new());
    }
}
