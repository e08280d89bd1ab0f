//! Progress of long operator commands (`projector rebuild`, `command-service apply`): on a
//! terminal, a bar with the rate and the time left (indicatif); otherwise (a log, a pipe) one
//! plain line every few seconds and one at the end, so a script's output stays readable.

use std::io::IsTerminal;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};

/// How often a plain line is printed while the work goes on.
const PLAIN_EVERY: Duration = Duration::from_secs(2);

pub struct Progress {
    label: String,
    unit: &'static str,
    total: u64,
    bar: Option<ProgressBar>,
    started: Instant,
    last_line: Instant,
}

impl Progress {
    /// Progress of `total` `unit`s of `label`, drawn on stderr.
    pub fn new(label: &str, total: u64, unit: &'static str) -> Self {
        let bar = std::io::stderr().is_terminal().then(|| {
            let bar = ProgressBar::new(total);
            let template =
                format!("{{msg}} [{{bar:40}}] {{human_pos}}/{{human_len}} {unit} ({{per_sec}}, {{eta}} left)");
            if let Ok(style) = ProgressStyle::with_template(&template) {
                bar.set_style(style.progress_chars("=> "));
            }
            bar.set_message(label.to_owned());
            bar
        });
        let now = Instant::now();
        Self { label: label.to_owned(), unit, total, bar, started: now, last_line: now }
    }

    /// The total changed (the log grew while a rebuild read it).
    pub fn set_total(&mut self, total: u64) {
        self.total = total;
        if let Some(bar) = &self.bar {
            bar.set_length(total);
        }
    }

    /// `done` of the total are done.
    pub fn set(&mut self, done: u64) {
        match &self.bar {
            Some(bar) => bar.set_position(done),
            None if self.last_line.elapsed() >= PLAIN_EVERY => {
                eprintln!("{}", self.line(done));
                self.last_line = Instant::now();
            }
            None => {}
        }
    }

    /// A line of text beside the progress (above the bar on a terminal).
    pub fn note(&self, text: &str) {
        match &self.bar {
            Some(bar) => bar.println(text),
            None => eprintln!("{text}"),
        }
    }

    /// The work is done: the bar is cleared and a last line printed.
    pub fn finish(self, done: u64) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
        eprintln!("{}", self.line(done));
    }

    /// `label: done of total unit (rate/s, about N s left)`.
    fn line(&self, done: u64) -> String {
        let elapsed = self.started.elapsed().as_secs_f64().max(0.001);
        let rate = done as f64 / elapsed;
        let left = match self.total.saturating_sub(done) {
            0 => String::new(),
            remaining if rate > 0.0 => format!(", about {:.0} s left", remaining as f64 / rate),
            _ => String::new(),
        };
        format!("{}: {done} of {} {} ({rate:.0}/s{left})", self.label, self.total, self.unit)
    }
}
