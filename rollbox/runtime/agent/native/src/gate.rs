//! `quiesce` and `resume` (gh-19): the channel at a frame boundary for a checkpoint, as
//! agent.py's OutputGate.
//!
//! The daemon sends `quiesce` last before a checkpoint, so once the agent has read it no
//! request is half-read. Its answer is written under the output lock, after any reply being
//! written, and the lock is then kept until `resume` names the hold (or `hold_s` passes): the
//! checkpoint finds no reply half-written either. A restored copy carries the hold; its
//! daemon's first request is a `resume` without a token, which releases whatever is held. A
//! `resume` that arrives before its `quiesce` ran (answered too late, the daemon went on)
//! cancels it.

use std::collections::VecDeque;
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

/// The longest hold, whatever the request asks (seconds).
const HOLD_MAX_S: f64 = 600.0;
/// A request without `hold_s` (or with 0) holds this long (seconds).
const HOLD_DEFAULT_S: f64 = 60.0;
/// Tokens of cancelled holds remembered.
const CANCELLED_KEPT: usize = 16;

#[derive(Default)]
struct State {
    /// The token of the hold in force.
    held: Option<String>,
    /// Tokens resumed before their `quiesce` ran.
    cancelled: VecDeque<String>,
}

#[derive(Default)]
pub struct Gate {
    st: Mutex<State>,
    cv: Condvar,
}

/// How long a hold lasts for a request's `hold_s` (agent.py: `float(req.get("hold_s") or 60)`,
/// negative or NaN as 0, at most 600).
pub fn hold_for(hold_s: Option<f64>) -> Duration {
    let s = hold_s.filter(|s| *s != 0.0).unwrap_or(HOLD_DEFAULT_S);
    Duration::from_secs_f64(if s >= 0.0 { s.min(HOLD_MAX_S) } else { 0.0 })
}

impl Gate {
    /// Takes the hold `token`; false when a `resume` already cancelled it (nothing is held).
    pub fn hold(&self, token: &str) -> bool {
        let mut st = self.st.lock().unwrap();
        if let Some(i) = st.cancelled.iter().position(|t| t == token) {
            st.cancelled.remove(i);
            return false;
        }
        st.held = Some(token.to_string());
        true
    }

    /// Waits until `resume` releases the hold `token` or `hold` has passed.
    pub fn wait(&self, token: &str, hold: Duration) {
        let deadline = Instant::now() + hold;
        let mut st = self.st.lock().unwrap();
        while st.held.as_deref() == Some(token) {
            let now = Instant::now();
            if now >= deadline {
                st.held = None;
                break;
            }
            st = self.cv.wait_timeout(st, deadline - now).unwrap().0;
        }
    }

    /// `resume`: releases the hold `token` (None: whatever is held), or cancels the `quiesce`
    /// of `token` that has not run yet.
    pub fn resume(&self, token: Option<&str>) {
        let mut st = self.st.lock().unwrap();
        match token {
            Some(t) if st.held.as_deref() != Some(t) => {
                if !st.cancelled.iter().any(|c| c == t) {
                    st.cancelled.push_back(t.to_string());
                    if st.cancelled.len() > CANCELLED_KEPT {
                        st.cancelled.pop_front();
                    }
                }
            }
            _ => {
                st.held = None;
                self.cv.notify_all();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn resume_releases_the_hold() {
        let g = Arc::new(Gate::default());
        assert!(g.hold("a"));
        let g2 = g.clone();
        let t0 = Instant::now();
        let waiter = std::thread::spawn(move || g2.wait("a", Duration::from_secs(30)));
        std::thread::sleep(Duration::from_millis(50));
        g.resume(Some("other")); // not this hold
        std::thread::sleep(Duration::from_millis(50));
        assert!(!waiter.is_finished());
        g.resume(Some("a"));
        waiter.join().unwrap();
        assert!(t0.elapsed() < Duration::from_secs(10));
    }

    #[test]
    fn resume_without_a_token_releases_any_hold() {
        let g = Arc::new(Gate::default());
        assert!(g.hold("a"));
        let g2 = g.clone();
        let waiter = std::thread::spawn(move || g2.wait("a", Duration::from_secs(30)));
        std::thread::sleep(Duration::from_millis(20));
        g.resume(None);
        waiter.join().unwrap();
    }

    #[test]
    fn a_resume_before_its_quiesce_cancels_it() {
        let g = Gate::default();
        g.resume(Some("late"));
        assert!(!g.hold("late"));
        assert!(g.hold("late")); // only once
    }

    #[test]
    fn a_hold_ends_by_itself() {
        let g = Gate::default();
        assert!(g.hold("a"));
        let t0 = Instant::now();
        g.wait("a", Duration::from_millis(100));
        assert!(t0.elapsed() >= Duration::from_millis(100));
        assert!(g.st.lock().unwrap().held.is_none());
    }

    #[test]
    fn cancelled_tokens_are_bounded() {
        let g = Gate::default();
        for i in 0..100 {
            g.resume(Some(&i.to_string()));
        }
        assert_eq!(g.st.lock().unwrap().cancelled.len(), CANCELLED_KEPT);
    }

    #[test]
    fn hold_lengths_as_agent_py() {
        assert_eq!(hold_for(None), Duration::from_secs(60));
        assert_eq!(hold_for(Some(0.0)), Duration::from_secs(60));
        assert_eq!(hold_for(Some(2.5)), Duration::from_millis(2500));
        assert_eq!(hold_for(Some(1e9)), Duration::from_secs(600));
        assert_eq!(hold_for(Some(-1.0)), Duration::ZERO);
        assert_eq!(hold_for(Some(f64::NAN)), Duration::ZERO);
    }
}
