//! The limits applied to one run's cgroup, checked before anything is created.

use super::error::CgroupError;

/// CFS period used with the CPU quota (both versions), in microseconds.
pub(super) const CPU_PERIOD_US: u64 = 100_000;
/// Smallest CFS quota the kernel accepts (1 ms), in microseconds.
pub(super) const MIN_CPU_QUOTA_US: u64 = 1_000;

/// Limits applied to one run's cgroup.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CgroupLimits {
    /// Memory limit in bytes (swap is disabled where the kernel lets us). Must not be 0.
    pub memory_bytes: u64,
    /// Maximum number of tasks (processes and threads). Must not be 0.
    pub pids: u64,
    /// CPU quota in milli-CPUs (1000 = one full CPU); 0 = unlimited.
    pub cpu_millis: u64,
}

impl CgroupLimits {
    pub(super) fn validate(&self) -> Result<(), CgroupError> {
        if self.memory_bytes == 0 {
            return Err(CgroupError::InvalidLimits {
                reason: "memory limit must be greater than 0",
            });
        }
        if self.pids == 0 {
            return Err(CgroupError::InvalidLimits {
                reason: "pids limit must be greater than 0",
            });
        }
        Ok(())
    }

    /// CFS quota per [`CPU_PERIOD_US`], `None` for unlimited. Clamped to the kernel's 1 ms minimum.
    pub(super) fn cpu_quota_us(&self) -> Option<u64> {
        (self.cpu_millis != 0).then(|| self.cpu_millis.saturating_mul(100).max(MIN_CPU_QUOTA_US))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_quota() {
        let q = |cpu_millis| {
            CgroupLimits {
                memory_bytes: 1,
                pids: 1,
                cpu_millis,
            }
            .cpu_quota_us()
        };
        assert_eq!(q(0), None);
        assert_eq!(q(1000), Some(100_000));
        assert_eq!(q(500), Some(50_000));
        assert_eq!(q(2500), Some(250_000));
        assert_eq!(q(1), Some(MIN_CPU_QUOTA_US));
        assert_eq!(q(u64::MAX), Some(u64::MAX));
    }
}
