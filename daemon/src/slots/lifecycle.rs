//! A slot's lifecycle as OpenTelemetry spans (traces on), made where every
//! state change passes ([`super::SlotManager::transition`]):
//!
//! - `slot start`: from the first step towards serving (locking, reset,
//!   proof, spawn, load, verification) to Ready (event `ready`), or to the
//!   failure that ended the attempt (status error with the reason), or to
//!   a stop; each state on the way is an event carrying its reason.
//! - `slot failure`: a serving slot that failed (its worker died or hung),
//!   a span of its own with the reason.
//!
//! A card reset is its own span (`card reset`, in the host crate's
//! `CardManager::reset`), whether a slot's start or `ttctl reset` asked.

use super::SlotState;
use tt_serving_telemetry::{attr, Attribute, Kind, Span};

/// The span of a start under way (empty when none is, or traces are off).
#[derive(Default)]
pub struct Lifecycle {
    start: Span,
}

/// States on the way from nothing to Ready.
fn starting(state: SlotState) -> bool {
    matches!(
        state,
        SlotState::Locking
            | SlotState::Resetting
            | SlotState::Probing
            | SlotState::Starting
            | SlotState::Loading
            | SlotState::Verifying
    )
}

impl Lifecycle {
    /// The slot `slot` of `model` went from `from` to `to` because of
    /// `reason` (a change of reason within a state is an event too).
    pub fn transition(
        &mut self,
        slot: &str,
        model: &str,
        from: SlotState,
        to: SlotState,
        reason: &str,
    ) {
        if !tt_serving_telemetry::enabled() {
            return;
        }
        let named = |span: &Span| {
            span.set_with(|| {
                vec![
                    Attribute::new(attr::SLOT, slot.to_string()),
                    Attribute::new(attr::MODEL, model.to_string()),
                ]
            })
        };
        if starting(to) && !self.start.is_recording() {
            self.start = Span::root("slot start", Kind::Internal, None, None);
            named(&self.start);
        }
        let state = SlotState::word;
        self.start.event("state", || {
            vec![
                Attribute::new("tt.slot.state", state(to)),
                Attribute::new("tt.slot.reason", reason.to_string()),
            ]
        });
        match to {
            SlotState::Ready => {
                self.start.event("ready", Vec::new);
                self.end();
            }
            SlotState::Failed | SlotState::Quarantined => {
                if self.start.is_recording() {
                    self.start.fail(|| reason.to_string());
                    self.end();
                } else if from != to {
                    let failure = Span::root("slot failure", Kind::Internal, None, None);
                    named(&failure);
                    failure.set("tt.slot.state", state(to));
                    failure.set("tt.slot.was", state(from));
                    failure.fail(|| reason.to_string());
                    failure.end();
                }
            }
            SlotState::Stopped | SlotState::Draining | SlotState::Pending => {
                self.start.set("tt.slot.ended", state(to));
                self.end();
            }
            _ => {}
        }
    }

    fn end(&mut self) {
        self.start.end();
        self.start = Span::none();
    }
}
