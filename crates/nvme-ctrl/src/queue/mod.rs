//! Submission and completion queues in guest memory, and their saved state.

pub mod cq;
pub mod saved;
pub mod sq;

pub use cq::CompletionQueue;
pub use saved::{CqState, SqState};
pub use sq::SubmissionQueue;
