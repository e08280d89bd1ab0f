//! A broadcast's experiment (pure): its definition (as the catalog stores it: ids and
//! milliseconds) and the rules it must follow, who of a run's
//! audience is in the test and which variant each gets, and the verdict at the end of the wait.
//!
//! The statistics are written out in `docs/decisions.md` ("Broadcast experiments"):
//! - a variant's rate is its unique engaged recipients (people only: machine opens and clicks
//!   are counted apart) over its delivered ones, with a Wilson score interval at 95%;
//! - the leader (the highest rate; the earlier variant on a tie) is compared with every other
//!   variant by a two-sided two-proportion z-test with a pooled variance;
//! - the leader is a clear winner when every comparison's p-value is below 0.05 divided by the
//!   number of comparisons (Bonferroni: eight variants make seven chances of a false winner),
//!   and every variant had at least [`MIN_OUTCOMES`] engaged and [`MIN_OUTCOMES`] not engaged
//!   recipients (below that the normal approximation the test rests on does not hold);
//! - without a clear winner, the experiment's fallback decides: the leader anyway
//!   (`send_best`), the control (`send_control`), or nobody else (`stop`).

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// Variants an experiment has, at least and at most.
pub const VARIANTS: std::ops::RangeInclusive<usize> = 2..=8;
/// The share of the audience in the test, in percent.
pub const TEST_SHARE: std::ops::RangeInclusive<u8> = 1..=50;
/// The wait between the test send's end and the verdict, in milliseconds: a minute to 30 days.
pub const WAIT_MS: std::ops::RangeInclusive<i64> = 60_000..=30 * 24 * 3_600_000;
/// The conversion window after a recipient's send: a minute to 30 days.
pub const WINDOW_MS: std::ops::RangeInclusive<i64> = 60_000..=30 * 24 * 3_600_000;
/// The longest preheader a variant may set, in characters (clients show 40 to 140).
pub const MAX_PREHEADER_CHARS: usize = 200;
/// The test's significance level before the correction for several comparisons.
pub const ALPHA: f64 = 0.05;
/// The fewest engaged, and the fewest not engaged, recipients each variant needs for the
/// normal approximation of the z-test to hold.
pub const MIN_OUTCOMES: i64 = 5;
/// The normal quantile of a two-sided 95% interval.
const Z_95: f64 = 1.959_963_984_540_054;

/// An experiment on a broadcast, as authored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ExperimentDef {
    /// The share of the run's audience in the test, in percent (1–50).
    pub test_share: u8,
    pub variants: Vec<VariantDef>,
    /// The variant that is the baseline: what `send_control` sends.
    #[serde(default)]
    pub control: Option<String>,
    #[serde(default)]
    pub metric: Metric,
    /// Milliseconds between the end of the test send and the verdict.
    pub wait_ms: i64,
    #[serde(default)]
    pub without_clear_winner: Fallback,
}

/// A variant: what it changes of the broadcast (nothing, for the original).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct VariantDef {
    /// Unique in the experiment: a letter or a short slug (`a`, `short-subject`).
    pub id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subject: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sender_id: Option<String>,
    /// The preview text mail clients show after the subject: hidden text at the start of the
    /// HTML body.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preheader: Option<String>,
}

/// What a variant is judged by.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "type")]
pub enum Metric {
    /// Recipients who clicked a tracked link (a person's click).
    #[default]
    Clicks,
    /// Recipients who opened (a person's open: privacy proxies and scanners are left out).
    Opens,
    /// Recipients who recorded an event of `schema_id` within `window_ms` after their send.
    #[serde(rename_all = "camelCase")]
    Conversion { schema_id: String, window_ms: i64 },
}

impl Metric {
    /// The name the verdict and the API use.
    pub fn name(&self) -> &'static str {
        match self {
            Metric::Clicks => "clicks",
            Metric::Opens => "opens",
            Metric::Conversion { .. } => "conversion",
        }
    }
}

/// What happens when no variant wins clearly.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Fallback {
    /// The leader goes to the rest anyway.
    #[default]
    SendBest,
    /// The control goes to the rest.
    SendControl,
    /// The rest gets nothing.
    Stop,
}

impl Fallback {
    pub fn as_str(self) -> &'static str {
        match self {
            Fallback::SendBest => "send_best",
            Fallback::SendControl => "send_control",
            Fallback::Stop => "stop",
        }
    }
}

/// Why a definition cannot be used: the field's path and what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Invalid {
    pub field: String,
    pub message: String,
}

fn invalid(field: impl Into<String>, message: impl Into<String>) -> Invalid {
    Invalid { field: field.into(), message: message.into() }
}

impl ExperimentDef {
    /// The rules a definition must follow by itself (the templates, senders and event schema
    /// it names are checked against the space by the caller). The first broken rule.
    pub fn check(&self) -> Result<(), Invalid> {
        if !TEST_SHARE.contains(&self.test_share) {
            return Err(invalid("experiment.testShare", "must be a whole percent from 1 to 50"));
        }
        if !VARIANTS.contains(&self.variants.len()) {
            return Err(invalid("experiment.variants", "must have from 2 to 8 variants"));
        }
        for (index, variant) in self.variants.iter().enumerate() {
            let valid = !variant.id.is_empty()
                && variant.id.len() <= 32
                && variant.id.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
            if !valid {
                let message = "must be 1 to 32 lowercase letters, digits or dashes";
                return Err(invalid(format!("experiment.variants[{index}].id"), message));
            }
            if self.variants[..index].iter().any(|earlier| earlier.id == variant.id) {
                let message = format!("{:?} names two variants", variant.id);
                return Err(invalid(format!("experiment.variants[{index}].id"), message));
            }
            if variant.subject.as_deref().is_some_and(|subject| subject.trim().is_empty() || subject.len() > 998) {
                let message = "must not be blank or longer than 998 bytes";
                return Err(invalid(format!("experiment.variants[{index}].subject"), message));
            }
            let preheader = variant.preheader.as_deref();
            if preheader.is_some_and(|text| text.trim().is_empty() || text.chars().count() > MAX_PREHEADER_CHARS) {
                let message = format!("must not be blank or longer than {MAX_PREHEADER_CHARS} characters");
                return Err(invalid(format!("experiment.variants[{index}].preheader"), message));
            }
        }
        if let Some(control) = &self.control
            && !self.variants.iter().any(|variant| &variant.id == control)
        {
            return Err(invalid("experiment.control", format!("{control:?} is not one of the variants")));
        }
        if self.without_clear_winner == Fallback::SendControl && self.control.is_none() {
            return Err(invalid("experiment.withoutClearWinner", "send_control needs a control"));
        }
        if !WAIT_MS.contains(&self.wait_ms) {
            return Err(invalid("experiment.waitMs", "must be from one minute to 30 days"));
        }
        if let Metric::Conversion { schema_id, window_ms } = &self.metric {
            if schema_id.is_empty() {
                return Err(invalid("experiment.metric.schemaId", "names the event schema that counts"));
            }
            if !WINDOW_MS.contains(window_ms) {
                return Err(invalid("experiment.metric.windowMs", "must be from one minute to 30 days"));
            }
            // The verdict counts a test recipient's conversions within the window after its
            // send: every window must have closed by the end of the wait.
            if *window_ms > self.wait_ms {
                return Err(invalid("experiment.metric.windowMs", "must not be longer than the wait"));
            }
        }
        Ok(())
    }

    /// The index of the control, if there is one.
    pub fn control_index(&self) -> Option<usize> {
        let control = self.control.as_ref()?;
        self.variants.iter().position(|variant| &variant.id == control)
    }
}

/// Where a recipient of a run falls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cohort {
    /// In the test, with the variant at this index.
    Test(usize),
    /// In the rest: sent the winner (or nothing) after the verdict.
    Rest,
}

/// Where `contact_id` falls in `run_id` of `broadcast_id`: drawn from a digest of the three, so
/// the split needs no state, is the same on every replay and in every process, and differs
/// between runs. `test_share` percent of contacts land in the test (to a basis point), spread
/// evenly over `variants`.
pub fn assign(broadcast_id: &str, run_id: &str, contact_id: &str, test_share: u8, variants: usize) -> Cohort {
    let digest = Sha256::new()
        .chain_update(broadcast_id)
        .chain_update([0u8])
        .chain_update(run_id)
        .chain_update([0u8])
        .chain_update(contact_id)
        .finalize();
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    let draw = u64::from_be_bytes(first);
    if draw % 10_000 >= u64::from(test_share) * 100 || variants == 0 {
        return Cohort::Rest;
    }
    let variants = u64::try_from(variants).unwrap_or(u64::MAX);
    Cohort::Test(usize::try_from((draw / 10_000) % variants).unwrap_or(0))
}

/// What a variant's test send came to, as read from the delivery log.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Tally {
    /// Test recipients assigned the variant (sent, skipped or failed).
    pub recipients: i64,
    /// Of them, those whose mail the relay took and that did not bounce.
    pub delivered: i64,
    /// Of the delivered, those who engaged by the metric (people only).
    pub engaged: i64,
    /// Recipients whose only engagement was a machine's (shown apart, never counted).
    pub machine: i64,
}

/// A variant's figures in the verdict.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Figures {
    pub variant: String,
    pub recipients: i64,
    pub delivered: i64,
    pub engaged: i64,
    pub machine: i64,
    /// `engaged / delivered`; 0 with nothing delivered.
    pub rate: f64,
    /// The Wilson score interval of the rate at 95%.
    pub interval: [f64; 2],
}

/// The leader against another variant.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Comparison {
    pub variant: String,
    /// The z statistic of the leader's rate minus this variant's.
    pub z: f64,
    /// Two-sided.
    pub p_value: f64,
    pub significant: bool,
}

/// The verdict at the end of the wait, with every figure it used.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Verdict {
    pub metric: &'static str,
    /// What the rest is sent: a variant's id, or `None` when the experiment stops.
    pub winner: Option<String>,
    /// Whether the leader won clearly.
    pub clear: bool,
    /// How the winner was chosen: `significant` (the leader beat every other variant),
    /// `send_best`, `send_control` or `stop` (the fallback, without a clear winner).
    pub rule: &'static str,
    /// Why there is no clear winner, when there is none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    pub leader: String,
    pub alpha: f64,
    /// `alpha` divided by the number of comparisons.
    pub corrected_alpha: f64,
    pub variants: Vec<Figures>,
    pub comparisons: Vec<Comparison>,
}

/// The verdict on `experiment` given each variant's tally, in the definition's order.
pub fn decide(experiment: &ExperimentDef, tallies: &[Tally]) -> Verdict {
    let variants: Vec<Figures> = experiment
        .variants
        .iter()
        .enumerate()
        .map(|(index, variant)| figures(&variant.id, tallies.get(index).copied().unwrap_or_default()))
        .collect();
    // The leader: the highest rate, the earlier variant on a tie.
    let leader = variants
        .iter()
        .enumerate()
        .fold(0, |best, (index, figures)| if figures.rate > variants[best].rate { index } else { best });
    let others = variants.len().saturating_sub(1).max(1);
    let corrected_alpha = ALPHA / others as f64;
    let comparisons: Vec<Comparison> = variants
        .iter()
        .enumerate()
        .filter(|(index, _)| *index != leader)
        .map(|(_, other)| {
            let (z, p_value) = z_test(&variants[leader], other);
            Comparison { variant: other.variant.clone(), z, p_value, significant: p_value < corrected_alpha }
        })
        .collect();
    let too_few = variants
        .iter()
        .find(|figures| figures.engaged < MIN_OUTCOMES || figures.delivered - figures.engaged < MIN_OUTCOMES);
    let reason = if let Some(figures) = too_few {
        Some(format!(
            "variant {:?} had {} engaged and {} not engaged of {} delivered: the test needs at least {MIN_OUTCOMES} of each",
            figures.variant,
            figures.engaged,
            figures.delivered - figures.engaged,
            figures.delivered
        ))
    } else {
        comparisons.iter().find(|comparison| !comparison.significant).map(|comparison| {
            format!(
                "the leader {:?} against {:?}: p = {:.4}, not below {:.4}",
                variants[leader].variant, comparison.variant, comparison.p_value, corrected_alpha
            )
        })
    };
    let leader_id = variants[leader].variant.clone();
    let (winner, rule) = match (&reason, experiment.without_clear_winner) {
        (None, _) => (Some(leader_id.clone()), "significant"),
        (Some(_), Fallback::SendBest) => (Some(leader_id.clone()), Fallback::SendBest.as_str()),
        (Some(_), Fallback::SendControl) => (experiment.control.clone(), Fallback::SendControl.as_str()),
        (Some(_), Fallback::Stop) => (None, Fallback::Stop.as_str()),
    };
    Verdict {
        metric: experiment.metric.name(),
        winner,
        clear: reason.is_none(),
        rule,
        reason,
        leader: leader_id,
        alpha: ALPHA,
        corrected_alpha,
        variants,
        comparisons,
    }
}

fn figures(variant: &str, tally: Tally) -> Figures {
    let (rate, interval) = if tally.delivered > 0 {
        let (n, x) = (tally.delivered as f64, tally.engaged.min(tally.delivered) as f64);
        (x / n, wilson(n, x))
    } else {
        (0.0, [0.0, 0.0])
    };
    Figures {
        variant: variant.to_owned(),
        recipients: tally.recipients,
        delivered: tally.delivered,
        engaged: tally.engaged,
        machine: tally.machine,
        rate,
        interval,
    }
}

/// The Wilson score interval of `x` successes in `n` trials at 95%.
fn wilson(n: f64, x: f64) -> [f64; 2] {
    let p = x / n;
    let z2 = Z_95 * Z_95;
    let denominator = 1.0 + z2 / n;
    let centre = (p + z2 / (2.0 * n)) / denominator;
    let half = Z_95 * (p * (1.0 - p) / n + z2 / (4.0 * n * n)).sqrt() / denominator;
    // At no success (or all) the bound is 0 (or 1) exactly, not a rounding error away.
    let low = if x <= 0.0 { 0.0 } else { (centre - half).max(0.0) };
    let high = if x >= n { 1.0 } else { (centre + half).min(1.0) };
    [low, high]
}

/// The two-sided two-proportion z-test with a pooled variance: `(z, p)`. With nothing to
/// compare (no delivery, or no variance at all) `z` is 0 and `p` is 1.
fn z_test(leader: &Figures, other: &Figures) -> (f64, f64) {
    let (n1, n2) = (leader.delivered as f64, other.delivered as f64);
    if n1 <= 0.0 || n2 <= 0.0 {
        return (0.0, 1.0);
    }
    let pooled = (leader.engaged + other.engaged) as f64 / (n1 + n2);
    let error = (pooled * (1.0 - pooled) * (1.0 / n1 + 1.0 / n2)).sqrt();
    if error <= 0.0 || !error.is_finite() {
        return (0.0, 1.0);
    }
    let z = (leader.rate - other.rate) / error;
    (z, libm::erfc(z.abs() / std::f64::consts::SQRT_2))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn variant(id: &str) -> VariantDef {
        VariantDef { id: id.into(), subject: None, template_id: None, sender_id: None, preheader: None }
    }

    fn experiment(ids: &[&str], fallback: Fallback) -> ExperimentDef {
        ExperimentDef {
            test_share: 20,
            variants: ids.iter().map(|id| variant(id)).collect(),
            control: Some(ids[0].to_owned()),
            metric: Metric::Clicks,
            wait_ms: 4 * 3_600_000,
            without_clear_winner: fallback,
        }
    }

    fn tally(delivered: i64, engaged: i64) -> Tally {
        Tally { recipients: delivered, delivered, engaged, machine: 0 }
    }

    fn close(actual: f64, expected: f64) -> bool {
        (actual - expected).abs() < 1e-9
    }

    // The expected figures were computed apart from this code, with Python's `math.erfc`:
    // z = (p1 - p2) / sqrt(p (1 - p) (1/n1 + 1/n2)), p-value = erfc(|z| / sqrt 2).

    #[test]
    fn given_two_variants_far_apart_when_decided_then_the_leader_wins_clearly_with_its_figures() {
        let verdict = decide(&experiment(&["a", "b"], Fallback::Stop), &[tally(1000, 100), tally(1000, 150)]);
        assert_eq!((verdict.winner.as_deref(), verdict.clear, verdict.rule), (Some("b"), true, "significant"));
        assert_eq!(verdict.leader, "b");
        let comparison = &verdict.comparisons[0];
        assert_eq!(comparison.variant, "a");
        assert!(close(comparison.z, 3.380_617_018_914_065_4), "z = {}", comparison.z);
        assert!(close(comparison.p_value, 0.000_723_232_716_430_195_5), "p = {}", comparison.p_value);
        assert!(close(verdict.corrected_alpha, 0.05), "one comparison: no correction");
        let b = &verdict.variants[1];
        assert!(close(b.rate, 0.15));
        assert!(close(b.interval[0], 0.129_210_072_513_088_3) && close(b.interval[1], 0.173_468_658_426_800_32));
        assert!(verdict.reason.is_none());
    }

    #[test]
    fn given_two_close_variants_when_decided_then_there_is_no_clear_winner_and_the_fallback_decides() {
        let tallies = [tally(1000, 130), tally(1000, 150)];
        let best = decide(&experiment(&["a", "b"], Fallback::SendBest), &tallies);
        assert!(close(best.comparisons[0].p_value, 0.197_450_880_842_592_96));
        assert_eq!((best.winner.as_deref(), best.clear, best.rule), (Some("b"), false, "send_best"));
        assert!(best.reason.as_deref().is_some_and(|reason| reason.contains("p = 0.1975")), "{:?}", best.reason);
        let control = decide(&experiment(&["a", "b"], Fallback::SendControl), &tallies);
        assert_eq!((control.winner.as_deref(), control.rule), (Some("a"), "send_control"));
        let stop = decide(&experiment(&["a", "b"], Fallback::Stop), &tallies);
        assert_eq!((stop.winner, stop.rule, stop.leader.as_str()), (None, "stop", "b"));
    }

    #[test]
    fn given_three_variants_when_one_comparison_passes_only_without_the_correction_then_no_variant_wins_clearly() {
        // The leader against b: p = 0.0078; against c: p = 0.0496, below 0.05 but not below
        // 0.025 (two comparisons).
        let verdict = decide(
            &experiment(&["a", "b", "c"], Fallback::Stop),
            &[tally(1000, 150), tally(1000, 110), tally(1000, 120)],
        );
        assert!(close(verdict.corrected_alpha, 0.025));
        let p: Vec<f64> = verdict.comparisons.iter().map(|comparison| comparison.p_value).collect();
        assert!(close(p[0], 0.007_823_724_726_272_96) && close(p[1], 0.049_640_386_865_363_55), "{p:?}");
        assert_eq!(
            verdict.comparisons.iter().map(|comparison| comparison.significant).collect::<Vec<_>>(),
            [true, false]
        );
        assert_eq!((verdict.winner, verdict.clear, verdict.leader.as_str()), (None, false, "a"));
    }

    #[test]
    fn given_machine_engagement_when_decided_then_it_is_shown_apart_and_never_makes_a_winner() {
        // Variant a's opens are mostly a privacy proxy's: counted apart, its people's rate is
        // low, and b wins.
        let tallies = [
            Tally { recipients: 1000, delivered: 1000, engaged: 60, machine: 700 },
            Tally { recipients: 1000, delivered: 1000, engaged: 120, machine: 20 },
        ];
        let mut opens = experiment(&["a", "b"], Fallback::Stop);
        opens.metric = Metric::Opens;
        let verdict = decide(&opens, &tallies);
        assert_eq!((verdict.metric, verdict.winner.as_deref(), verdict.clear), ("opens", Some("b"), true));
        assert_eq!(verdict.variants[0].machine, 700);
        assert!(close(verdict.variants[0].rate, 0.06));
    }

    #[test]
    fn given_too_few_engaged_recipients_when_decided_then_no_variant_wins_clearly_whatever_the_p_value() {
        let verdict = decide(&experiment(&["a", "b"], Fallback::SendControl), &[tally(40, 0), tally(40, 4)]);
        assert!(!verdict.clear);
        assert_eq!((verdict.winner.as_deref(), verdict.rule), (Some("a"), "send_control"));
        assert!(verdict.reason.as_deref().is_some_and(|reason| reason.contains("at least 5")), "{:?}", verdict.reason);
    }

    #[test]
    fn given_nothing_delivered_when_decided_then_the_rates_are_zero_and_the_first_variant_leads_without_a_clear_win() {
        let verdict = decide(&experiment(&["a", "b", "c"], Fallback::SendBest), &[Tally::default(); 3]);
        assert_eq!((verdict.leader.as_str(), verdict.winner.as_deref(), verdict.clear), ("a", Some("a"), false));
        assert!(verdict.variants.iter().all(|figures| figures.rate == 0.0 && figures.interval == [0.0, 0.0]));
        let none = decide(&experiment(&["a", "b"], Fallback::Stop), &[tally(48, 0), tally(6, 6)]);
        assert_eq!(none.variants[0].interval[0], 0.0, "no engagement: the lower bound is 0 exactly");
        assert_eq!(none.variants[1].interval[1], 1.0, "all engaged: the upper bound is 1 exactly");
        assert!(verdict.comparisons.iter().all(|comparison| comparison.p_value == 1.0 && comparison.z == 0.0));
    }

    #[test]
    fn a_recipients_cohort_is_the_same_on_every_draw_differs_between_runs_and_fills_the_share_evenly() {
        let draw = |run: &str, contact: usize| assign("bc_1", run, &format!("rec_{contact}"), 20, 4);
        assert_eq!(draw("bcr_1", 7), draw("bcr_1", 7));
        let cohorts: Vec<Cohort> = (0..20_000).map(|contact| draw("bcr_1", contact)).collect();
        let other_run: Vec<Cohort> = (0..20_000).map(|contact| draw("bcr_2", contact)).collect();
        assert_ne!(cohorts, other_run, "another run draws another split");
        let test = cohorts.iter().filter(|cohort| matches!(cohort, Cohort::Test(_))).count();
        assert!((3_700..=4_300).contains(&test), "20% of 20,000 in the test: {test}");
        for index in 0..4 {
            let count = cohorts.iter().filter(|cohort| **cohort == Cohort::Test(index)).count();
            assert!((850..=1_150).contains(&count), "variant {index} of 4 has {count} of {test}");
        }
        assert_eq!(assign("bc_1", "bcr_1", "rec_1", 20, 0), Cohort::Rest, "no variant: nobody is tested");
    }

    #[test]
    fn a_definition_is_refused_by_its_first_broken_rule_with_the_field_named() {
        assert_eq!(experiment(&["a", "b"], Fallback::SendControl).check(), Ok(()));
        let refused = |change: &dyn Fn(&mut ExperimentDef)| {
            let mut definition = experiment(&["a", "b"], Fallback::SendBest);
            change(&mut definition);
            definition.check().expect_err("refused").field
        };
        assert_eq!(refused(&|d| d.test_share = 0), "experiment.testShare");
        assert_eq!(refused(&|d| d.test_share = 51), "experiment.testShare");
        assert_eq!(refused(&|d| d.variants.truncate(1)), "experiment.variants");
        assert_eq!(
            refused(&|d| d.variants = (0..9).map(|i| variant(&format!("v{i}"))).collect()),
            "experiment.variants"
        );
        assert_eq!(refused(&|d| d.variants[1].id = "a".into()), "experiment.variants[1].id");
        assert_eq!(refused(&|d| d.variants[0].id = "Big A".into()), "experiment.variants[0].id");
        assert_eq!(refused(&|d| d.variants[1].subject = Some("  ".into())), "experiment.variants[1].subject");
        assert_eq!(refused(&|d| d.variants[1].preheader = Some(" ".into())), "experiment.variants[1].preheader");
        assert_eq!(refused(&|d| d.variants[0].preheader = Some("x".repeat(201))), "experiment.variants[0].preheader");
        assert_eq!(refused(&|d| d.control = Some("z".into())), "experiment.control");
        assert_eq!(
            refused(&|d| {
                d.control = None;
                d.without_clear_winner = Fallback::SendControl;
            }),
            "experiment.withoutClearWinner"
        );
        assert_eq!(refused(&|d| d.wait_ms = 59_999), "experiment.waitMs");
        assert_eq!(refused(&|d| d.wait_ms = 30 * 24 * 3_600_000 + 1), "experiment.waitMs");
        assert_eq!(
            refused(&|d| d.metric = Metric::Conversion { schema_id: "order".into(), window_ms: 0 }),
            "experiment.metric.windowMs"
        );
        let longer_than_the_wait = |d: &mut ExperimentDef| {
            d.metric = Metric::Conversion { schema_id: "order".into(), window_ms: d.wait_ms + 1 };
        };
        assert_eq!(refused(&longer_than_the_wait), "experiment.metric.windowMs");
        assert_eq!(
            refused(&|d| d.metric = Metric::Conversion { schema_id: String::new(), window_ms: 60_000 }),
            "experiment.metric.schemaId"
        );
    }

    #[test]
    fn a_stored_definition_reads_back_with_its_defaults_and_refuses_unknown_fields() {
        let read: ExperimentDef = serde_json::from_value(serde_json::json!({
            "testShare": 10,
            "variants": [{"id": "a"}, {"id": "b", "subject": "Last days: 20% off"}],
            "metric": {"type": "conversion", "schemaId": "sch_order", "windowMs": 86_400_000},
            "waitMs": 14_400_000,
            "withoutClearWinner": "stop"
        }))
        .expect("the documented shape");
        assert_eq!(read.metric, Metric::Conversion { schema_id: "sch_order".into(), window_ms: 86_400_000 });
        assert_eq!((read.without_clear_winner, read.control), (Fallback::Stop, None));
        let defaults: ExperimentDef = serde_json::from_value(
            serde_json::json!({"testShare": 10, "variants": [{"id": "a"}, {"id": "b"}], "waitMs": 60_000}),
        )
        .expect("defaults");
        assert_eq!((defaults.metric, defaults.without_clear_winner), (Metric::Clicks, Fallback::SendBest));
        let typo = serde_json::from_value::<ExperimentDef>(serde_json::json!({
            "testShare": 10, "variants": [{"id": "a"}, {"id": "b"}], "waitMs": 60_000, "winnerMetric": "opens"
        }));
        assert!(typo.is_err(), "a misspelt field is refused, not ignored");
    }
}
