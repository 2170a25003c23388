//! Submission and completion queues in guest memory.

pub mod cq;
pub mod sq;

pub use cq::CompletionQueue;
pub use sq::SubmissionQueue;
