//! Requests made together: what concurrent callers of a process ask for while one statement
//! runs is answered by the next, in one statement. Each caller asks before the statement that
//! answers it starts, so the answer is at least as new as the request; only the round trips
//! are shared. Used by the email hand-offs' claims and by standby reads' anchors.

use std::future::Future;

use tokio::sync::{mpsc, oneshot};

/// Why a batched request has no answer.
#[derive(Debug, Clone, thiserror::Error)]
pub enum BatchError {
    /// The batcher's task has ended (the process is stopping).
    #[error("the batcher has stopped")]
    Stopped,
    /// The statement of the request's batch failed.
    #[error("{0}")]
    Failed(String),
}

type Job<I, O> = (I, oneshot::Sender<Result<O, BatchError>>);

/// Runs `run` on the requests that arrived together, at most `max` at a time.
pub struct Batcher<I, O> {
    jobs: mpsc::Sender<Job<I, O>>,
}

impl<I, O> Clone for Batcher<I, O> {
    fn clone(&self) -> Self {
        Self { jobs: self.jobs.clone() }
    }
}

impl<I: Send + 'static, O: Send + 'static> Batcher<I, O> {
    /// Starts the batcher's task. `run` answers a batch's requests in their order, one answer
    /// each.
    pub fn start<F, Fut>(max: usize, run: F) -> Self
    where
        F: Fn(Vec<I>) -> Fut + Send + 'static,
        Fut: Future<Output = anyhow::Result<Vec<O>>> + Send,
    {
        let (jobs, mut receiver) = mpsc::channel::<Job<I, O>>(max * 4);
        tokio::spawn(async move {
            let mut batch = Vec::with_capacity(max);
            while receiver.recv_many(&mut batch, max).await > 0 {
                let (inputs, replies): (Vec<I>, Vec<_>) = batch.drain(..).unzip();
                let count = inputs.len();
                match run(inputs).await {
                    Ok(outputs) if outputs.len() == count => {
                        for (reply, output) in replies.into_iter().zip(outputs) {
                            let _ = reply.send(Ok(output));
                        }
                    }
                    Ok(outputs) => {
                        let error = format!("{} answers for {count} requests", outputs.len());
                        for reply in replies {
                            let _ = reply.send(Err(BatchError::Failed(error.clone())));
                        }
                    }
                    Err(error) => {
                        let error = format!("{error:#}");
                        for reply in replies {
                            let _ = reply.send(Err(BatchError::Failed(error.clone())));
                        }
                    }
                }
            }
        });
        Self { jobs }
    }

    /// `input`'s answer, from the next batch.
    pub async fn call(&self, input: I) -> Result<O, BatchError> {
        let (reply, answer) = oneshot::channel();
        self.jobs.send((input, reply)).await.map_err(|_| BatchError::Stopped)?;
        answer.await.map_err(|_| BatchError::Stopped)?
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn concurrent_requests_share_batches_and_each_gets_its_own_answer() {
        let batches = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let seen = batches.clone();
        let batcher = Batcher::start(4, move |inputs: Vec<u32>| {
            if let Ok(mut seen) = seen.lock() {
                seen.push(inputs.len());
            }
            async move {
                anyhow::ensure!(!inputs.contains(&99), "a bad batch");
                Ok(inputs.into_iter().map(|input| input * 10).collect())
            }
        });
        let answers = futures_util::future::join_all((0..10).map(|input| batcher.call(input))).await;
        let answers: Vec<u32> = answers.into_iter().map(|answer| answer.unwrap_or(0)).collect();
        assert_eq!(answers, (0..10).map(|input| input * 10).collect::<Vec<_>>());
        let sizes = batches.lock().map(|sizes| sizes.clone()).unwrap_or_default();
        assert!(sizes.iter().all(|size| *size <= 4) && sizes.iter().sum::<usize>() == 10, "{sizes:?}");
        assert!(matches!(batcher.call(99).await, Err(BatchError::Failed(_))));
    }
}
