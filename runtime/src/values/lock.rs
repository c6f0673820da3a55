//! Which kind a lock is.

/// A lock's kind: how many may hold it at once and how it is handed over. Each kind lives at
/// its own key, apart from the other kinds of the same name.
///
/// ```
/// use redguard::lock::LockKind;
/// assert!(LockKind::Exclusive.is_reentrant());
/// assert!(!LockKind::Semaphore { permits: 3 }.is_reentrant());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum LockKind {
    /// One holder at a time; reentrant within a task.
    Exclusive,
    /// One holder at a time, handed over in arrival order; reentrant within a task.
    Fair,
    /// Up to `permits` holders at once, each with its own lease.
    Semaphore {
        /// How many may hold it at once.
        permits: u32,
    },
    /// The read/write lock of the key, held in read mode: many readers, no writer.
    Read,
    /// The read/write lock of the key, held in write mode: one writer, no readers.
    Write,
}

impl LockKind {
    /// True for the kinds one task may enter again while holding them.
    pub fn is_reentrant(self) -> bool {
        matches!(self, LockKind::Exclusive | LockKind::Fair)
    }

    /// The suffix of the kind's key after the lock's own name (`None` for an exclusive lock,
    /// which lives at the name itself).
    pub(crate) fn suffix(self) -> Option<&'static str> {
        match self {
            LockKind::Exclusive => None,
            LockKind::Fair => Some("fair"),
            LockKind::Semaphore { .. } => Some("sem"),
            LockKind::Read | LockKind::Write => Some("rw"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_kind_has_its_own_key_and_reentrancy() {
        let kinds = [
            (LockKind::Exclusive, None, true),
            (LockKind::Fair, Some("fair"), true),
            (LockKind::Semaphore { permits: 2 }, Some("sem"), false),
            (LockKind::Read, Some("rw"), false),
            (LockKind::Write, Some("rw"), false),
        ];
        for (kind, suffix, reentrant) in kinds {
            assert_eq!(kind.suffix(), suffix, "{kind:?}");
            assert_eq!(kind.is_reentrant(), reentrant, "{kind:?}");
        }
    }
}
