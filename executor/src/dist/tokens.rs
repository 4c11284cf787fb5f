//! The step outputs of a world's engine as processes without the readback rank see them: the
//! readback process hands each step's token to the others (`Body::Token`), which take them
//! in step order here. The CUDA engine's processes exchange nothing else through the world
//! (their boundaries and collectives travel over NCCL), so any other message is an error.

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex};

use anyhow::{bail, Result};

use super::{Body, Deliver, Link};
use crate::engine::StepOutput;

/// Tokens from the readback process, waiting to be taken.
#[derive(Default)]
pub struct TokenInbox {
    state: Mutex<Inbox>,
    changed: Condvar,
}

#[derive(Default)]
struct Inbox {
    outputs: VecDeque<StepOutput>,
    failure: Option<String>,
}

impl TokenInbox {
    /// An inbox attached to `link`: it receives the engine's messages from now on.
    pub fn attached(link: &Link) -> Arc<TokenInbox> {
        let inbox = Arc::new(TokenInbox::default());
        let deliver: Arc<dyn Deliver> = inbox.clone();
        link.attach(Arc::downgrade(&deliver));
        inbox
    }

    /// The next step's output (its token, without logits), waiting for it.
    pub fn next(&self) -> Result<StepOutput> {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if let Some(out) = st.outputs.pop_front() {
                return Ok(out);
            }
            if let Some(why) = &st.failure {
                bail!("{why}");
            }
            st = self.changed.wait(st).unwrap_or_else(|e| e.into_inner());
        }
    }

    fn set_failure(&self, why: String) {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        st.failure.get_or_insert(why);
        self.changed.notify_all();
    }
}

impl Deliver for TokenInbox {
    fn deliver(&self, from: u32, body: Body) {
        match body {
            Body::Token { step, pos, token } => {
                let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
                st.outputs.push_back(StepOutput {
                    step,
                    pos,
                    token,
                    logits: Vec::new(),
                    argmax: Vec::new(),
                });
                self.changed.notify_all();
            }
            other => self.set_failure(format!(
                "process {from} sent {other:?} to an engine that takes only tokens from other processes; every process must run the same backend"
            )),
        }
    }

    fn fail(&self, why: &str) {
        self.set_failure(why.to_string());
    }
}

/// Hands `out`'s token to every process of the world but this one.
pub fn broadcast(link: &Link, out: &StepOutput) -> Result<()> {
    for q in link.others() {
        link.send(
            q,
            Body::Token {
                step: out.step,
                pos: out.pos,
                token: out.token,
            },
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn token(step: u64) -> Body {
        Body::Token {
            step,
            pos: step as u32 + 5,
            token: 100 + step as u32,
        }
    }

    #[test]
    fn tokens_come_out_in_the_order_they_arrived() {
        let inbox = TokenInbox::default();
        inbox.deliver(1, token(0));
        inbox.deliver(1, token(1));
        let (a, b) = (inbox.next().unwrap(), inbox.next().unwrap());
        assert_eq!((a.step, a.pos, a.token), (0, 5, 100));
        assert_eq!((b.step, b.pos, b.token), (1, 6, 101));
        assert!(a.logits.is_empty());
    }

    #[test]
    fn a_waiting_take_ends_with_the_worlds_failure() {
        let inbox = Arc::new(TokenInbox::default());
        let waiter = {
            let inbox = inbox.clone();
            std::thread::spawn(move || inbox.next())
        };
        inbox.fail("process 1 died");
        let e = waiter.join().unwrap().unwrap_err().to_string();
        assert_eq!(e, "process 1 died");
    }

    #[test]
    fn another_message_than_a_token_fails_the_inbox() {
        let inbox = TokenInbox::default();
        inbox.deliver(
            2,
            Body::Record {
                event: "b0.ready".into(),
                step: 0,
            },
        );
        let e = inbox.next().unwrap_err().to_string();
        assert!(
            e.starts_with("process 2 sent Record") && e.contains("same backend"),
            "{e}"
        );
    }
}
