//! The reload plan: what a new config changes, slot by slot, and why.
//!
//! A slot's definition is its model's settings (less `cards`/`replicas`)
//! plus its own cards. Equal definitions keep the slot untouched; a
//! difference only in the router's limits updates them live; any other
//! difference restarts the slot. Slots only in the old config stop, slots
//! only in the new one start. Daemon-level sections cannot change under a
//! running daemon (sockets, directories, hardware paths), so their changes
//! are listed as needing a restart and not applied.

use crate::config::diff::{changed_keys_shown, is_live, to_value};
use crate::config::{Config, ModelConfig};
use crate::slots::configured_slots;
use std::collections::BTreeMap;

/// What happens to one slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Unchanged: keeps running, untouched.
    Keep,
    /// Only router limits changed: applied live, the worker keeps running.
    Update,
    /// Drained, stopped and started with the new definition.
    Restart,
    /// Removed: drained and stopped, its cards released.
    Stop,
    /// Added: started on its cards.
    Start,
}

impl Action {
    /// The word ttctl and the logs show.
    pub fn word(self) -> &'static str {
        match self {
            Action::Keep => "keep",
            Action::Update => "update",
            Action::Restart => "restart",
            Action::Stop => "stop",
            Action::Start => "start",
        }
    }
}

/// One slot's part of the plan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Step {
    /// Slot name.
    pub slot: String,
    /// Model name.
    pub model: String,
    /// What happens.
    pub action: Action,
    /// Why, in words (the keys that changed).
    pub reason: String,
}

/// The whole plan.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan {
    /// Every slot of the old and the new config, by name.
    pub steps: Vec<Step>,
    /// Daemon-level changes that are not applied until a restart.
    pub needs_restart: Vec<String>,
}

impl Plan {
    /// Whether applying the plan changes anything at all.
    pub fn changes_slots(&self) -> bool {
        self.steps.iter().any(|s| s.action != Action::Keep)
    }

    /// Slots with this action.
    pub fn slots(&self, action: Action) -> Vec<String> {
        self.steps
            .iter()
            .filter(|s| s.action == action)
            .map(|s| s.slot.clone())
            .collect()
    }

    /// One line: counts per action.
    pub fn summary(&self) -> String {
        let mut parts = Vec::new();
        for action in [
            Action::Keep,
            Action::Update,
            Action::Restart,
            Action::Stop,
            Action::Start,
        ] {
            let n = self.steps.iter().filter(|s| s.action == action).count();
            if n > 0 {
                parts.push(format!("{n} {}", action.word()));
            }
        }
        if parts.is_empty() {
            parts.push("no slots".into());
        }
        if !self.needs_restart.is_empty() {
            parts.push(format!(
                "{} setting(s) need a restart",
                self.needs_restart.len()
            ));
        }
        parts.join(", ")
    }
}

/// The one section a reload applies; every other one (daemon, hardware,
/// reset, and any added later) waits for a restart.
const LIVE_SECTION: &str = "models";

/// Compare two configs. `variant` gives the cache variant a model definition
/// selects, so that the plan can say when a restart means a cold build.
/// `running` names the slots that run another definition than `old`'s (a
/// rolling restart that halted left them behind; see
/// [`crate::slots::SlotManager::outdated`]): they are compared by what they
/// run, so a later reload brings them to the new definition, and does not
/// restart them when the new one is what they already run.
pub fn diff(
    old: &Config,
    new: &Config,
    variant: &dyn Fn(&str, &ModelConfig) -> String,
    running: &BTreeMap<String, ModelConfig>,
    values: bool,
) -> Plan {
    let mut old_slots = slot_definitions(old);
    for (slot, m) in running {
        if let Some((_, def)) = old_slots.get_mut(slot) {
            *def = with_settings(def, m);
        }
    }
    let new_slots = slot_definitions(new);
    let mut steps = Vec::new();
    for (slot, (model, new_def)) in &new_slots {
        let step = |action, reason: String| Step {
            slot: slot.clone(),
            model: model.clone(),
            action,
            reason,
        };
        match old_slots.get(slot) {
            None => steps.push(step(Action::Start, "added to the config".into())),
            Some((old_model, old_def)) => {
                let changes = changed_keys_shown(old_def, new_def, values);
                let behind = running.get(slot);
                let note = |reason: String| {
                    match behind {
                    Some(_) => format!(
                        "ran an older definition than the config in force (a rolling restart halted); against it: {reason}"
                    ),
                    None => reason,
                }
                };
                if changes.is_empty() {
                    steps.push(step(
                        Action::Keep,
                        match behind {
                            Some(_) => "already runs this definition".into(),
                            None => "unchanged".into(),
                        },
                    ));
                } else if changes.iter().all(|(key, _)| is_live(key)) {
                    steps.push(step(Action::Update, note(describe(&changes))));
                } else {
                    let mut reason = note(describe(&changes));
                    let old_m = behind.or_else(|| old.models.get(old_model));
                    if let (Some(o), Some(n)) = (old_m, new.models.get(model)) {
                        let (ov, nv) = (variant(old_model, o), variant(model, n));
                        // Compared on the config's inputs only: the engine's
                        // identity joins the key at the start.
                        if ov != nv {
                            reason.push_str(
                                "; new cache variant (what the config puts in its key changes): cold build unless built before",
                            );
                        }
                    }
                    steps.push(step(Action::Restart, reason));
                }
            }
        }
    }
    for (slot, (model, _)) in &old_slots {
        if !new_slots.contains_key(slot) {
            steps.push(Step {
                slot: slot.clone(),
                model: model.clone(),
                action: Action::Stop,
                reason: "removed from the config".into(),
            });
        }
    }
    steps.sort_by(|a, b| a.slot.cmp(&b.slot));
    let mut needs_restart = Vec::new();
    let (mut old_v, mut new_v) = (to_value(old), to_value(new));
    for v in [&mut old_v, &mut new_v] {
        if let toml::Value::Table(t) = v {
            t.remove(LIVE_SECTION);
        }
    }
    for (key, change) in changed_keys_shown(&old_v, &new_v, values) {
        needs_restart.push(format!("{key}: {change}"));
    }
    Plan {
        steps,
        needs_restart,
    }
}

/// The config a reload puts in force: the new models with the old
/// daemon-level sections (those wait for a restart). Every section but
/// `models` must be copied from `old` here.
pub fn in_force(old: &Config, new: &Config) -> Config {
    Config {
        models: new.models.clone(),
        ..old.clone()
    }
}

/// A slot definition (see [`slot_definitions`]) with the model settings of
/// `m` and the slot's own cards kept.
fn with_settings(def: &toml::Value, m: &ModelConfig) -> toml::Value {
    let mut out = to_value(m);
    if let toml::Value::Table(t) = &mut out {
        t.remove("cards");
        t.remove("replicas");
        if let Some(cards) = def.get("cards") {
            t.insert("cards".into(), cards.clone());
        }
    }
    out
}

/// Slot name -> (model, definition) where the definition is the model's
/// settings with the slot's own cards in place of `cards`/`replicas`.
fn slot_definitions(config: &Config) -> BTreeMap<String, (String, toml::Value)> {
    let mut out = BTreeMap::new();
    let slots = configured_slots(config);
    for (model, m) in &config.models {
        let mut base = to_value(m);
        if let toml::Value::Table(t) = &mut base {
            t.remove("cards");
            t.remove("replicas");
        }
        let names = slots.iter().filter(|(_, owner)| owner == model);
        for ((slot, _), cards) in names.zip(m.card_sets()) {
            let mut def = base.clone();
            if let toml::Value::Table(t) = &mut def {
                let cards: Vec<toml::Value> = cards
                    .iter()
                    .map(|c| toml::Value::String(c.to_string()))
                    .collect();
                t.insert("cards".into(), toml::Value::Array(cards));
            }
            out.insert(slot.clone(), (model.clone(), def));
        }
    }
    out
}

fn describe(changes: &[(String, String)]) -> String {
    changes
        .iter()
        .map(|(k, c)| format!("{k}: {c}"))
        .collect::<Vec<_>>()
        .join("; ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::diff::outdated_keys;

    fn config(models: &str) -> Config {
        let text = format!(
            "[daemon]\ncontrol_socket = \"/run/t/control.sock\"\nstate_dir = \"/var/lib/t\"\ncache_dir = \"/var/cache/t\"\nlock_dir = \"/run/lock/t\"\n{models}"
        );
        match crate::config::parse(&text) {
            Ok(c) => c,
            Err(p) => panic!("test config invalid: {p:?}"),
        }
    }

    const A: &str = "[models.a]\ntp = 1\ncards = [\"0000:01:00.0\"]\ncheckpoint = \"/m/a.gguf\"\n";
    const B: &str = "[models.b]\ntp = 1\ncards = [\"0000:02:00.0\"]\ncheckpoint = \"/m/b.gguf\"\ncache_flags = [\"KV\"]\n[models.b.flags]\nKV = \"0\"\n";

    fn variant(_: &str, m: &ModelConfig) -> String {
        m.flags.get("KV").cloned().unwrap_or_default()
    }

    fn action(plan: &Plan, slot: &str) -> (Action, String) {
        let s = plan
            .steps
            .iter()
            .find(|s| s.slot == slot)
            .unwrap_or_else(|| panic!("no step for {slot} in {plan:?}"));
        (s.action, s.reason.clone())
    }

    #[test]
    fn identical_configs_keep_everything() {
        let c = config(&format!("{A}{B}"));
        let plan = diff(&c, &c, &variant, &BTreeMap::new(), true);
        assert!(!plan.changes_slots());
        assert_eq!(plan.summary(), "2 keep");
    }

    #[test]
    fn a_cache_flag_restarts_only_its_model_and_names_the_cold_build() {
        let old = config(&format!("{A}{B}"));
        let new = config(&format!("{A}{}", B.replace("KV = \"0\"", "KV = \"1\"")));
        let plan = diff(&old, &new, &variant, &BTreeMap::new(), true);
        assert_eq!(action(&plan, "a").0, Action::Keep);
        let (act, why) = action(&plan, "b");
        assert_eq!(act, Action::Restart);
        assert!(why.contains("flags.KV: \"0\" → \"1\""), "{why}");
        assert!(why.contains("new cache variant (what the config"), "{why}");
    }

    #[test]
    fn router_limits_update_live() {
        let old = config(A);
        let new = config(&format!("{A}max_in_flight = 2\n"));
        let plan = diff(&old, &new, &variant, &BTreeMap::new(), true);
        let (act, why) = action(&plan, "a");
        assert_eq!(act, Action::Update);
        assert_eq!(why, "max_in_flight: 8 → 2");
        // The router reads the recovery wait per request: live too.
        let new = config(&format!("{A}recovery_wait_secs = 0\n"));
        let plan = diff(&old, &new, &variant, &BTreeMap::new(), true);
        assert_eq!(
            action(&plan, "a"),
            (Action::Update, "recovery_wait_secs: 30 → 0".to_string())
        );
        // And whether it routes by prefix affinity.
        let new = config(&format!("{A}prefix_affinity = false\n"));
        let plan = diff(&old, &new, &variant, &BTreeMap::new(), true);
        assert_eq!(
            action(&plan, "a"),
            (Action::Update, "prefix_affinity: true → false".to_string())
        );
    }

    #[test]
    fn replicas_added_and_removed_at_the_end_leave_the_others_alone() {
        let two = "[models.r]\ntp = 1\nreplicas = [[\"0000:03:00.0\"], [\"0000:04:00.0\"]]\ncheckpoint = \"/m/r.gguf\"\n";
        let three = two.replace("]]\n", "], [\"0000:05:00.0\"]]\n");
        let (old, new) = (config(two), config(&three));
        let plan = diff(&old, &new, &variant, &BTreeMap::new(), true);
        assert_eq!(action(&plan, "r/0").0, Action::Keep);
        assert_eq!(action(&plan, "r/1").0, Action::Keep);
        assert_eq!(action(&plan, "r/2").0, Action::Start);
        let back = diff(&new, &old, &variant, &BTreeMap::new(), true);
        assert_eq!(action(&back, "r/2").0, Action::Stop);
        assert_eq!(action(&back, "r/0").0, Action::Keep);
    }

    #[test]
    fn removed_model_stops_and_new_model_starts() {
        let plan = diff(&config(A), &config(B), &variant, &BTreeMap::new(), true);
        assert_eq!(action(&plan, "a").0, Action::Stop);
        assert_eq!(action(&plan, "b").0, Action::Start);
        assert_eq!(plan.summary(), "1 stop, 1 start");
    }

    #[test]
    fn daemon_settings_need_a_restart_and_are_not_applied() {
        let old = config(A);
        let mut new = old.clone();
        new.daemon.listen = "0.0.0.0:9000".into();
        new.reset.attempts = 7;
        let plan = diff(&old, &new, &variant, &BTreeMap::new(), true);
        assert!(!plan.changes_slots());
        assert_eq!(
            plan.needs_restart,
            vec![
                "daemon.listen: \"127.0.0.1:50051\" → \"0.0.0.0:9000\"".to_string(),
                "reset.attempts: 3 → 7".to_string()
            ]
        );
        let applied = in_force(&old, &new);
        assert_eq!(applied.daemon.listen, "127.0.0.1:50051");
        assert_eq!(applied.reset.attempts, 3);
    }

    #[test]
    fn a_plan_without_values_names_the_keys_only() {
        let old = config(&format!("{A}[models.a.flags]\nKV = \"bf16\"\n"));
        let new = config(&format!(
            "{A}[models.a.flags]\nKV = \"bfp8\"\nNEW = \"yes-new\"\n"
        ));
        let plan = diff(&old, &new, &variant, &BTreeMap::new(), false);
        let (_, why) = action(&plan, "a");
        assert!(
            why.contains("flags.KV: changed") && why.contains("flags.NEW: added"),
            "{why}"
        );
        for value in ["bf16", "bfp8", "yes-new"] {
            assert!(!why.contains(value), "{why}");
        }
        let shown = diff(&old, &new, &variant, &BTreeMap::new(), true);
        assert!(action(&shown, "a").1.contains("\"bf16\" → \"bfp8\""));
    }

    #[test]
    fn environment_values_never_appear_in_the_plan() {
        let old = config(&format!("{A}[models.a.env]\nTOKEN = \"hunter2\"\n"));
        let new = config(&format!(
            "{A}[models.a.env]\nTOKEN = \"s3cret\"\nOTHER = \"x1\"\n"
        ));
        let plan = diff(&old, &new, &variant, &BTreeMap::new(), true);
        let (act, why) = action(&plan, "a");
        assert_eq!(act, Action::Restart);
        assert!(why.contains("env.TOKEN: changed (value hidden)"), "{why}");
        assert!(why.contains("env.OTHER: added"), "{why}");
        for secret in ["hunter2", "s3cret", "x1"] {
            assert!(!why.contains(secret), "{why}");
        }
    }

    #[test]
    fn replicas_left_behind_by_a_halted_roll_are_compared_by_what_they_run() {
        let model = |kv: &str| {
            format!("[models.r]\ntp = 1\nreplicas = [[\"0000:03:00.0\"], [\"0000:04:00.0\"]]\ncheckpoint = \"/m/r.gguf\"\ncache_flags = [\"KV\"]\n[models.r.flags]\nKV = \"{kv}\"\n")
        };
        // Definition 1 was in force; a reload to 2 restarted r/0 and halted,
        // so 2 is in force while r/1 still runs 1.
        let (one, two) = (config(&model("1")), config(&model("2")));
        let running: BTreeMap<String, ModelConfig> =
            [("r/1".to_string(), one.models["r"].clone())].into();
        assert_eq!(
            outdated_keys(&one.models["r"], &two.models["r"]),
            vec!["flags.KV".to_string()]
        );
        // Reverting to 1: r/1 already runs it; r/0 goes back.
        let revert = diff(&two, &one, &variant, &running, true);
        assert_eq!(action(&revert, "r/0").0, Action::Restart);
        let (act, why) = action(&revert, "r/1");
        assert_eq!(
            (act, why.as_str()),
            (Action::Keep, "already runs this definition")
        );
        // Reloading 2 again (its cause fixed): r/1 catches up; r/0 runs it.
        let again = diff(&two, &two, &variant, &running, true);
        assert_eq!(action(&again, "r/0").0, Action::Keep);
        let (act, why) = action(&again, "r/1");
        assert_eq!(act, Action::Restart);
        assert!(why.starts_with("ran an older definition"), "{why}");
        assert!(why.contains("flags.KV: \"1\" → \"2\""), "{why}");
        // Only live limits apart: not outdated.
        let mut limits = two.models["r"].clone();
        limits.max_queue += 1;
        assert!(outdated_keys(&limits, &two.models["r"]).is_empty());
    }
}
