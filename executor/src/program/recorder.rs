//! A `RankOps` that runs nothing and records what a walk enqueued, for the tests of the walks
//! (the lockstep rounds here, the CUDA engine's walk sets).

use anyhow::Result;

use super::{Block, Entered, RankOps, Work};
use crate::engine::StepInput;

/// One entry a member enqueued.
#[derive(Debug, Clone, PartialEq)]
pub enum Enqueued {
    /// A wait for `event` at program index `at`, at step `t`.
    Wait { event: String, at: usize, t: u64 },
    /// A record of `event` at step `t`.
    Record { event: String, t: u64 },
    /// The copy of a boundary's slot.
    Copy { boundary: u32 },
    /// The step's readback.
    Readback,
    /// A work item of a block (every block is walked).
    Work(Work),
}

/// Records what member `member` enqueued into `log`, which the members of a walk share;
/// nothing ever waits.
pub struct Recorder<'a, M> {
    pub member: M,
    pub log: &'a mut Vec<(M, Enqueued)>,
}

impl<M: Copy> Recorder<'_, M> {
    fn push(&mut self, e: Enqueued) {
        self.log.push((self.member, e));
    }
}

impl<M: Copy> RankOps for Recorder<'_, M> {
    fn wait(&mut self, _: &str, event: &str, at: usize, t: u64, _: bool) -> Result<bool> {
        let event = event.to_string();
        self.push(Enqueued::Wait { event, at, t });
        Ok(true)
    }

    fn record(&mut self, _: &str, event: &str, t: u64) -> Result<()> {
        let event = event.to_string();
        self.push(Enqueued::Record { event, t });
        Ok(())
    }

    fn copy(&mut self, _: &str, boundary: u32, _: u64) -> Result<()> {
        self.push(Enqueued::Copy { boundary });
        Ok(())
    }

    fn readback(&mut self, _: &str, _: u64, _: &StepInput) -> Result<()> {
        self.push(Enqueued::Readback);
        Ok(())
    }

    fn enter(&mut self, _: &str, _: usize, _: &Block, _: u64, _: &StepInput) -> Result<Entered> {
        Ok(Entered::Walk)
    }

    fn work(&mut self, _: &str, work: Work, _: u64, _: &StepInput, _: bool) -> Result<bool> {
        self.push(Enqueued::Work(work));
        Ok(true)
    }
}
