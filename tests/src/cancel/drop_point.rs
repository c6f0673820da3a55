//! Where an attempt drops the operation's future: after a number of polls, or at a time while
//! Redis is paused.

use std::fmt;
use std::future::Future;
use std::pin::{Pin, pin};
use std::task::Poll;
use std::time::{Duration, Instant};

use super::View;

/// Where an attempt drops the operation's future.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DropPoint {
    /// Right after its n-th poll (n ≥ 1), unless it completed in one of them: what that poll
    /// asked of other tasks (a Redis connection's writer, say) has not happened yet.
    Poll(usize),
    /// After its n-th poll and a few turns of the runtime without polling it again: what
    /// that poll asked for is under way (a request written to Redis, whose reply comes
    /// after the caller gave up).
    PollAndYield(usize),
    /// At a time while Redis is paused.
    Stalled(Stall),
}

impl fmt::Display for DropPoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DropPoint::Poll(n) => write!(f, "after poll {n}"),
            DropPoint::PollAndYield(n) => write!(f, "after poll {n} and a turn of the runtime"),
            DropPoint::Stalled(stall) => write!(
                f,
                "at {} ms, Redis paused {}..{} ms",
                stall.drop_at.as_millis(),
                stall.from.as_millis(),
                (stall.from + stall.pause).as_millis()
            ),
        }
    }
}

/// Redis paused (`CLIENT PAUSE <ms> ALL`, sent on a connection of its own) from `from` after
/// the operation starts, for `pause`; the operation is dropped `drop_at` after it starts if
/// it has not completed by then.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stall {
    /// When the pause starts, from the operation's start.
    pub from: Duration,
    /// How long Redis stays paused.
    pub pause: Duration,
    /// When the operation is dropped, from its start.
    pub drop_at: Duration,
}

impl Stall {
    /// A stall from `from_ms` for `pause_ms`, dropping at `drop_ms`.
    pub const fn at(from_ms: u64, pause_ms: u64, drop_ms: u64) -> Stall {
        Stall {
            from: Duration::from_millis(from_ms),
            pause: Duration::from_millis(pause_ms),
            drop_at: Duration::from_millis(drop_ms),
        }
    }

    /// Runs `future` under this stall: its output, or `None` when it was dropped at
    /// `drop_at`. Returns once the pause is over, so what the caller checks next sees Redis
    /// answering again.
    pub(super) async fn drive<F: Future>(self, view: &View, future: F) -> Option<F::Output> {
        let (from, pause) = (self.from, self.pause);
        // A pause from the start is in place before the operation's first call.
        let mut resumes = None;
        if from.is_zero() {
            view.pause(pause).await;
            resumes = Some(Instant::now() + pause);
        }
        let started = Instant::now();
        let pauser = view.clone();
        let later = (!from.is_zero()).then(|| {
            tokio::spawn(async move {
                tokio::time::sleep_until((started + from).into()).await;
                pauser.pause(pause).await;
                Instant::now() + pause
            })
        });
        let output = tokio::time::timeout_at((started + self.drop_at).into(), future)
            .await
            .ok();
        if let Some(task) = later {
            resumes = Some(task.await.expect("pause task"));
        }
        if let Some(resumes) = resumes {
            tokio::time::sleep_until(resumes.into()).await;
        }
        output
    }
}

/// Polls `future` at most `polls` times (at least once): its output if it completed, `None`
/// if it was still pending after the last of them, in which case it is dropped right there,
/// inside that poll.
pub async fn poll_at_most<F: Future>(future: F, polls: usize) -> Option<F::Output> {
    poll_up_to(pin!(future), polls).await
}

/// Like [`poll_at_most`], but a future still pending after its last poll is dropped only
/// after the runtime has run its other tasks a few times.
pub async fn poll_at_most_then_yield<F: Future>(future: F, polls: usize) -> Option<F::Output> {
    let mut future = pin!(future);
    let output = poll_up_to(future.as_mut(), polls).await;
    if output.is_none() {
        // Alive, not polled: what its last poll started goes on meanwhile.
        for _ in 0..YIELDS {
            tokio::task::yield_now().await;
        }
    }
    output
}

async fn poll_up_to<F: Future>(mut future: Pin<&mut F>, polls: usize) -> Option<F::Output> {
    let mut left = polls.max(1);
    std::future::poll_fn(move |cx| {
        left -= 1;
        match future.as_mut().poll(cx) {
            Poll::Ready(output) => Poll::Ready(Some(output)),
            Poll::Pending if left == 0 => Poll::Ready(None),
            Poll::Pending => Poll::Pending,
        }
    })
    .await
}

/// Turns of the runtime a [`DropPoint::PollAndYield`] gives other tasks.
const YIELDS: usize = 4;

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn drops_after_the_given_poll() {
        let three_polls = || async {
            tokio::task::yield_now().await;
            tokio::task::yield_now().await;
            7
        };
        assert_eq!(poll_at_most(three_polls(), 1).await, None);
        assert_eq!(poll_at_most(three_polls(), 2).await, None);
        assert_eq!(poll_at_most(three_polls(), 3).await, Some(7));
        assert_eq!(poll_at_most(three_polls(), 30).await, Some(7));
        assert_eq!(poll_at_most_then_yield(three_polls(), 2).await, None);
        assert_eq!(poll_at_most_then_yield(three_polls(), 3).await, Some(7));
    }
}
