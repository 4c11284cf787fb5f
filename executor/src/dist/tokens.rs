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
