//! A bounded ring of a worker's recent output lines, for `ttctl logs`.
//! Followers subscribe to new lines through a broadcast channel; a follower
//! that falls behind skips lines rather than slowing the worker down.

use std::collections::VecDeque;
use std::sync::Mutex;
use tokio::sync::broadcast;

/// Which stream a line came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    /// The worker's stdout.
    Stdout,
    /// The worker's stderr.
    Stderr,
}

/// One captured line.
#[derive(Debug, Clone)]
pub struct LogLine {
    /// Milliseconds since the Unix epoch when it was read.
    pub unix_ms: u64,
    /// Where it came from.
    pub stream: Stream,
    /// The text, without the newline.
    pub text: String,
}

/// The ring buffer and its followers.
pub struct LogRing {
    lines: Mutex<VecDeque<LogLine>>,
    capacity: usize,
    follow: broadcast::Sender<LogLine>,
}

impl LogRing {
    /// A ring that keeps the last `capacity` lines.
    pub fn new(capacity: usize) -> LogRing {
        LogRing {
            lines: Mutex::new(VecDeque::with_capacity(capacity.min(4096))),
            capacity,
            follow: broadcast::channel(1024).0,
        }
    }

    /// Append a line (dropping the oldest beyond capacity) and tell followers.
    pub fn push(&self, line: LogLine) {
        {
            let mut lines = self.lines.lock().unwrap_or_else(|e| e.into_inner());
            if lines.len() == self.capacity {
                lines.pop_front();
            }
            lines.push_back(line.clone());
        }
        // No followers is the normal case.
        let _ = self.follow.send(line);
    }

    /// The last `n` lines, oldest first.
    pub fn tail(&self, n: usize) -> Vec<LogLine> {
        let lines = self.lines.lock().unwrap_or_else(|e| e.into_inner());
        lines
            .iter()
            .skip(lines.len().saturating_sub(n))
            .cloned()
            .collect()
    }

    /// New lines from now on.
    pub fn subscribe(&self) -> broadcast::Receiver<LogLine> {
        self.follow.subscribe()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(text: &str) -> LogLine {
        LogLine {
            unix_ms: 0,
            stream: Stream::Stdout,
            text: text.into(),
        }
    }

    #[test]
    fn keeps_only_the_newest_lines() {
        let ring = LogRing::new(3);
        for i in 0..5 {
            ring.push(line(&i.to_string()));
        }
        let texts: Vec<String> = ring.tail(10).into_iter().map(|l| l.text).collect();
        assert_eq!(texts, ["2", "3", "4"]);
        assert_eq!(ring.tail(1)[0].text, "4");
    }

    #[tokio::test]
    async fn followers_see_new_lines() {
        let ring = LogRing::new(3);
        let mut rx = ring.subscribe();
        ring.push(line("hello"));
        assert_eq!(rx.recv().await.unwrap().text, "hello");
    }
}
