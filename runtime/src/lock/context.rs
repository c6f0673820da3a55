//! The task context of locked work: its fencing token, and the levels of locks the task
//! holds, so a nested acquisition of the same lock re-enters it at the next level.

use std::future::Future;
use std::sync::Arc;

use crate::key::Key;

/// Set while a locked future runs.
#[derive(Debug, Clone)]
struct LockContext {
    fence: u64,
    held: Arc<Vec<Level>>,
}

/// A level of a lock the current task holds.
#[derive(Debug, Clone)]
struct Level {
    key: String,
    owner: String,
    /// 1 for the lock itself, n for the n-th nested entry.
    level: u32,
}

tokio::task_local! {
    static CONTEXT: LockContext;
}

/// The fencing token of the innermost lock held by the current task, inside a
/// `#[dist_lock]` fn or [`LockBuilder::run`](super::LockBuilder::run); `None` outside, or when
/// the store was down and the lock failed open (no token was issued).
///
/// Pass it to storage that can reject stale writers (`UPDATE … WHERE fence < $token`): a
/// holder paused past its lease then carries a smaller token than the next holder.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> redguard::Result<()> {
/// let rg = redguard::Redguard::memory();
/// assert_eq!(redguard::lock::fence(), None);
/// let fence = rg.lock("stock:SK1").run(async { Ok::<_, redguard::Error>(redguard::lock::fence()) }).await?;
/// assert!(fence.is_some());
/// # Ok(()) }
/// ```
pub fn fence() -> Option<u64> {
    CONTEXT
        .try_with(|cx| cx.fence)
        .ok()
        .filter(|fence| *fence > 0)
}

/// The owner token to present for `key` and the level to take: the token this task already
/// holds the lock with and the level above its innermost one (a nested acquisition), else a
/// fresh random token at level 1.
pub(super) fn owner_for(key: &Key) -> (String, u32) {
    let held = CONTEXT
        .try_with(|cx| {
            cx.held
                .iter()
                .rev()
                .find(|held| held.key == key.as_str())
                .map(|held| (held.owner.clone(), held.level + 1))
        })
        .ok()
        .flatten();
    held.unwrap_or_else(|| (new_owner(), 1))
}

/// A random owner token.
pub(super) fn new_owner() -> String {
    // Encoded into a buffer: `to_string` would go through `fmt`, for 32 hex digits.
    let mut hex = [0; uuid::fmt::Simple::LENGTH];
    uuid::Uuid::new_v4()
        .simple()
        .encode_lower(&mut hex)
        .to_owned()
}

/// Runs a locked future with its task context (fence, levels held) in place.
pub(super) async fn with_context<F: Future>(
    key: &Key,
    owner: &str,
    level: u32,
    fence: u64,
    work: F,
) -> F::Output {
    let mut held: Vec<Level> = CONTEXT
        .try_with(|cx| cx.held.as_ref().clone())
        .unwrap_or_default();
    held.push(Level {
        key: key.as_str().to_owned(),
        owner: owner.to_owned(),
        level,
    });
    let cx = LockContext {
        fence,
        held: Arc::new(held),
    };
    CONTEXT.scope(cx, work).await
}

#[cfg(test)]
mod tests {
    #[test]
    fn owner_tokens_are_32_lowercase_hex_digits_and_differ() {
        let (a, b) = (super::new_owner(), super::new_owner());
        for token in [&a, &b] {
            assert_eq!(token.len(), 32, "{token}");
            assert!(
                token
                    .bytes()
                    .all(|c| matches!(c, b'0'..=b'9' | b'a'..=b'f')),
                "{token}"
            );
        }
        assert_ne!(a, b);
    }
}
