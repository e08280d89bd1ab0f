//! The step-history window of a run (decision D10): at most 100 records by `index` ascending,
//! the last ones before a bound. Pure.

use domain::workflows::HISTORY_WINDOW;

/// The indexes a window shows, `[from, to]` (empty when `from > to`), for a run whose last
/// record is `step_count`, before `history_before` (`None`: after the last record).
pub fn window(step_count: i32, history_before: Option<i32>) -> (i32, i32) {
    let to = history_before.map_or(step_count, |before| (before - 1).min(step_count));
    let from = (to - HISTORY_WINDOW + 1).max(1);
    (from, to)
}

/// `nextHistoryBeforeIndex`: the window's first index when a record with a lower index
/// exists.
pub(crate) fn next_before((from, to): (i32, i32)) -> Option<i32> {
    (from <= to && from > 1).then_some(from)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_walk_back_to_the_first_record() {
        assert_eq!(window(150, None), (51, 150));
        assert_eq!(next_before(window(150, None)), Some(51));
        assert_eq!(window(150, Some(51)), (1, 50));
        assert_eq!(next_before(window(150, Some(51))), None);
        assert_eq!(window(150, Some(1)), (1, 0), "empty");
        assert_eq!(next_before(window(150, Some(1))), None);
        assert_eq!(window(30, None), (1, 30));
        assert_eq!(next_before(window(30, None)), None);
        assert_eq!(window(30, Some(500)), (1, 30), "a bound past the end reads to the end");
        assert_eq!(window(0, None), (1, 0));
    }
}
