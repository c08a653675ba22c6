//! `auto` loop selection: the task's complexity picks the loop, budget pressure downgrades
//! hybrid to plan-execute, and an optional fallback redirects hybrid.

use nerve_core::{Complexity, LoopType};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct AutoLoopConfig {
    /// Budget use (percent of the tightest budget) at or above which hybrid becomes plan-execute.
    pub budget_tight_percent: u32,
    /// Where hybrid selections go instead, when set.
    pub hybrid_fallback: Option<LoopType>,
    /// The loop when the complexity is unknown.
    pub default_loop: LoopType,
}

impl Default for AutoLoopConfig {
    fn default() -> Self {
        Self {
            budget_tight_percent: 80,
            hybrid_fallback: None,
            default_loop: LoopType::React,
        }
    }
}

/// The concrete loop for `requested`. `budget_used_percent` is the share of the tightest
/// budget already spent (0 when there is no budget).
pub fn select_loop(
    requested: LoopType,
    complexity: Option<Complexity>,
    budget_used_percent: u32,
    config: &AutoLoopConfig,
) -> LoopType {
    if requested != LoopType::Auto {
        return requested;
    }
    let by_complexity = match complexity {
        Some(Complexity::Simple) => LoopType::React,
        Some(Complexity::Medium) => LoopType::PlanExecute,
        Some(Complexity::Complex | Complexity::Epic) => LoopType::Hybrid,
        None => config.default_loop,
    };
    if by_complexity != LoopType::Hybrid {
        return by_complexity;
    }
    // The budget downgrade takes precedence over the fallback.
    if budget_used_percent >= config.budget_tight_percent {
        return LoopType::PlanExecute;
    }
    match config.hybrid_fallback {
        Some(fallback) if fallback != LoopType::Auto => fallback,
        Some(_) | None => LoopType::Hybrid,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(
        complexity: Option<Complexity>,
        used: u32,
        fallback: Option<LoopType>,
        expected: LoopType,
    ) {
        let config = AutoLoopConfig {
            hybrid_fallback: fallback,
            ..AutoLoopConfig::default()
        };
        assert_eq!(
            select_loop(LoopType::Auto, complexity, used, &config),
            expected,
            "{complexity:?} {used}% {fallback:?}"
        );
    }

    #[test]
    fn selection_table() {
        use Complexity::{Complex, Epic, Medium, Simple};
        use LoopType::{Hybrid, PlanExecute, React};
        check(Some(Simple), 0, None, React);
        check(Some(Medium), 0, None, PlanExecute);
        check(Some(Complex), 0, None, Hybrid);
        check(Some(Epic), 0, None, Hybrid);
        check(None, 0, None, React);
        // Budget pressure downgrades hybrid at 80% and above, not below.
        check(Some(Complex), 79, None, Hybrid);
        check(Some(Complex), 80, None, PlanExecute);
        check(Some(Epic), 95, None, PlanExecute);
        // The fallback redirects hybrid, but the budget downgrade wins over it.
        check(Some(Complex), 0, Some(React), React);
        check(Some(Complex), 85, Some(React), PlanExecute);
        // Neither touches non-hybrid selections.
        check(Some(Simple), 99, Some(Hybrid), React);
        check(Some(Medium), 99, Some(React), PlanExecute);
        // An explicit loop is never overridden.
        let config = AutoLoopConfig::default();
        assert_eq!(select_loop(Hybrid, Some(Simple), 99, &config), Hybrid);
    }
}
