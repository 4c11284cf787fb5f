//! Walking the members of one group through a step in rounds, a collective a round
//! (`Lockstep`), for a backend that enqueues every rank from one host thread.

use anyhow::Result;

use super::{walk, Block, Cursor, Entered, Program, RankOps, Work};
use crate::engine::StepInput;

/// Members of one group walked through a step in rounds: a member's turn walks it up to and
/// including its next collective (`Work::AllReduce`, `Work::GatherLogits`), so no member
/// enqueues work after a collective before every member has enqueued its side of it. A
/// backend that enqueues every rank from one host thread needs this when a rank's enqueueing
/// may block on the rank's own progress (a read-back, a full launch queue): in plan order the
/// blocked member's stream would wait in a collective for peers not enqueued yet.
#[derive(Debug, Clone)]
pub struct Lockstep {
    cursors: Vec<Cursor>,
    done: Vec<bool>,
}

impl Lockstep {
    /// `members` members at the start of a step.
    pub fn new(members: usize) -> Lockstep {
        Lockstep {
            cursors: vec![Cursor::default(); members],
            done: vec![false; members],
        }
    }

    /// Whether member `j` finished the step.
    pub fn done(&self, j: usize) -> bool {
        self.done[j]
    }

    /// Whether every member finished the step.
    pub fn finished(&self) -> bool {
        !self.done.contains(&false)
    }

    /// Member `j`'s turn of this round: walks `program` on `ops` (blocking waits) to the end
    /// of the step or just past its next collective; `progressed` becomes true when anything
    /// ran.
    pub fn turn<R: RankOps + ?Sized>(
        &mut self,
        j: usize,
        program: &Program,
        ops: &mut R,
        t: u64,
        input: &StepInput,
        progressed: &mut bool,
    ) -> Result<()> {
        let mut ops = PauseAfterCollective { ops, paused: false };
        self.done[j] = walk(
            program,
            &mut ops,
            &mut self.cursors[j],
            t,
            input,
            true,
            progressed,
        )?;
        Ok(())
    }
}

/// `ops`, refusing every work item after the first collective it ran.
struct PauseAfterCollective<'a, R: ?Sized> {
    ops: &'a mut R,
    paused: bool,
}

impl<R: RankOps + ?Sized> RankOps for PauseAfterCollective<'_, R> {
    fn wait(&mut self, stream: &str, event: &str, at: usize, t: u64, block: bool) -> Result<bool> {
        self.ops.wait(stream, event, at, t, block)
    }

    fn record(&mut self, stream: &str, event: &str, t: u64) -> Result<()> {
        self.ops.record(stream, event, t)
    }

    fn copy(&mut self, stream: &str, boundary: u32, t: u64) -> Result<()> {
        self.ops.copy(stream, boundary, t)
    }

    fn readback(&mut self, stream: &str, t: u64, input: &StepInput) -> Result<()> {
        self.ops.readback(stream, t, input)
    }

    fn enter(
        &mut self,
        stream: &str,
        at: usize,
        block: &Block,
        t: u64,
        input: &StepInput,
    ) -> Result<Entered> {
        self.ops.enter(stream, at, block, t, input)
    }

    fn work(
        &mut self,
        stream: &str,
        work: Work,
        t: u64,
        input: &StepInput,
        block: bool,
    ) -> Result<bool> {
        if self.paused {
            return Ok(false);
        }
        let ran = self.ops.work(stream, work, t, input, block)?;
        self.paused = ran && matches!(work, Work::AllReduce | Work::GatherLogits);
        Ok(ran)
    }
}

#[cfg(test)]
mod tests {
    use super::super::recorder::{Enqueued, Recorder};
    use super::super::Entry;
    use super::*;
    use memra_compiler::plan::Segment;

    fn member(rank: u32, head: bool) -> Program {
        let seg = |segment| Work::Segment { layer: 0, segment };
        let mut work = vec![
            Work::Embed,
            seg(Segment::AttnOut),
            Work::AllReduce,
            seg(Segment::MoeRouter),
            seg(Segment::MoeExperts),
            Work::AllReduce,
            Work::Head,
            Work::GatherLogits,
        ];
        if head {
            work.push(Work::Sample);
        }
        let block = Block {
            id: format!("r{rank}.run0"),
            phases: Some(1),
            work,
        };
        let s = |e| ("compute".to_string(), e);
        Program {
            rank,
            entries: vec![
                s(Entry::Wait {
                    event: format!("r{rank}.in"),
                }),
                s(Entry::Block(block)),
                s(Entry::Record {
                    event: format!("r{rank}.out"),
                }),
            ],
        }
    }

    #[test]
    fn lockstep_enqueues_every_side_of_a_collective_before_the_work_after_it() {
        let programs = [member(0, true), member(1, false), member(2, false)];
        let input = StepInput::sampled(7);
        let mut lock = Lockstep::new(programs.len());
        let mut log = Vec::new();
        let mut rounds = 0;
        while !lock.finished() {
            let mut progressed = false;
            for (j, p) in programs.iter().enumerate() {
                if !lock.done(j) {
                    let mut ops = Recorder {
                        member: j,
                        log: &mut log,
                    };
                    lock.turn(j, p, &mut ops, 7, &input, &mut progressed)
                        .expect("the log never fails");
                }
            }
            assert!(progressed, "a round enqueues something");
            rounds += 1;
        }
        // three collectives, then the rest: four rounds
        assert_eq!(rounds, 4);
        // every member's program, whole and in its order
        for (j, p) in programs.iter().enumerate() {
            let mine = log.iter().filter(|(m, _)| *m == j).count();
            assert_eq!(mine, p.entries.len() - 1 + if j == 0 { 9 } else { 8 });
        }
        // the c-th collective of every member comes before any work a member enqueues after
        // its own c-th collective (waits, records and copies never block the host)
        let collective =
            |e: &Enqueued| matches!(e, Enqueued::Work(Work::AllReduce | Work::GatherLogits));
        let entry = |e: &Enqueued| matches!(e, Enqueued::Wait { .. } | Enqueued::Record { .. });
        // by collective: where its last side was enqueued
        let mut complete = [0usize; 4];
        let mut sides = [[0usize; 3]; 4];
        let mut count = [0usize; 3];
        for (i, (m, w)) in log.iter().enumerate() {
            if collective(w) {
                count[*m] += 1;
                sides[count[*m]][*m] = i;
                complete[count[*m]] = sides[count[*m]].into_iter().max().unwrap_or(0);
            }
        }
        assert_eq!(count, [3, 3, 3]);
        let mut count = [0usize; 3];
        for (i, (m, w)) in log.iter().enumerate() {
            if collective(w) {
                count[*m] += 1;
            } else if count[*m] > 0 && !entry(w) {
                assert!(
                    complete[count[*m]] < i,
                    "member {m} enqueued {w:?} at {i} before every side of collective {}",
                    count[*m]
                );
            }
        }
    }
}
