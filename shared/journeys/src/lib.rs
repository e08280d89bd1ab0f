//! A journey's next transition, decided without IO ([`decide`]): the projector's engine makes
//! every transition of a run with it, a replay plays a definition over the log with it, and
//! the command service's trigger makes a run's first transition with it in the append that
//! requests the run, when that transition needs no fact and has no effect.

pub mod decide;
