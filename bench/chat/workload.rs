//! The multi-turn chat workload: what is sent, and one round of it.
//!
//! A round is the whole workload once: `conversations` chats run
//! concurrently, each sequential in its `turns`, all opening with the same
//! long system prompt. Every turn resends the system prompt and the whole
//! history (the assistant's messages are the text the server answered)
//! plus a new short user message, as chat clients do. The system prompt's
//! first line names the round, so nothing a previous round left in an
//! engine's cache matches beyond its first few tokens, while within a round
//! every conversation shares it.

use crate::client::{chat_once, HttpClient, Reply};
use serde_json::{json, Value};
use std::time::{Duration, Instant};

/// What one round sends.
#[derive(Debug, Clone, Copy)]
pub struct Shape {
    /// Chats running concurrently.
    pub conversations: usize,
    /// Turns per chat, one after another.
    pub turns: usize,
    /// `max_tokens` of every turn (with `ignore_eos`, every answer's length).
    pub max_tokens: u32,
}

/// Where one arm's requests go.
#[derive(Debug, Clone)]
pub struct Target {
    /// `http://host:port`.
    pub base: String,
    /// The `model` field.
    pub model: String,
}

/// One turn as its client saw it.
#[derive(Debug, Clone)]
pub struct TurnSample {
    /// Which conversation.
    pub conversation: usize,
    /// 0-based turn within its conversation.
    pub turn: usize,
    /// What the server said.
    pub reply: Reply,
}

/// One round as the client saw it.
#[derive(Debug, Clone)]
pub struct RoundSample {
    /// From the first request sent to the last answer's end.
    pub wall: Duration,
    /// Every turn of every conversation.
    pub turns: Vec<TurnSample>,
}

/// Subjects of the help desk's rules; a conversation asks about one.
const TOPICS: [&str; 13] = [
    "opening hours",
    "late fees",
    "meeting room bookings",
    "printing and scanning",
    "lost library cards",
    "interlibrary loans",
    "e-books and audiobooks",
    "children's reading hour",
    "wheelchair access",
    "bicycle parking",
    "book donations",
    "quiet study rooms",
    "the guest wifi",
];

/// How the assistant is told to answer, one per rule.
const MANNERS: [&str; 4] = [
    "answer in two short sentences and point the visitor to the front desk for anything unusual",
    "give the rule first, then one practical tip, and keep a friendly but brief tone",
    "say what the handbook says, and if the handbook is silent, say so instead of guessing",
    "check which branch the visitor means before answering, because the branches differ",
];

/// The shared system prompt of round `round`: about 500 tokens of
/// SmolLM2's tokenizer (the driver measures and records the real count).
pub fn system_prompt(round: usize) -> String {
    let mut text = format!(
        "Session {round}. You are the help desk assistant of the Harbour Street Public Library, \
         which has three branches: Harbour Street, Mill Lane and the Old Station.\n\
         Follow these rules in every answer:\n"
    );
    for (i, topic) in TOPICS.iter().enumerate() {
        text.push_str(&format!(
            "{}. When a visitor asks about {topic}, {}.\n",
            i + 1,
            MANNERS[i % MANNERS.len()]
        ));
    }
    text.push_str(
        "Never invent opening times, prices or phone numbers that are not in the handbook. \
         Never ask for a visitor's card number, password or address. \
         If a visitor is upset, apologise once, then help with the problem itself. \
         Keep every answer under eighty words, use plain language, and avoid lists unless \
         the visitor asks for steps. Sign nothing and add no greeting after the first turn.",
    );
    text
}

/// The user's message of `turn` in conversation `conversation`: short, and
/// different per conversation from the first turn on, so conversations
/// share only the system prompt.
pub fn user_message(conversation: usize, turn: usize) -> String {
    let topic = TOPICS[conversation % TOPICS.len()];
    match turn {
        0 => format!("Hello, I am visitor {conversation}. What are the rules for {topic}?"),
        1 => "Can you give me an example of how that works in practice?".into(),
        2 => "And what happens if I cannot follow that rule this week?".into(),
        _ => format!("Thanks. Is there anything else about {topic} I should know?"),
    }
}

/// Run the workload once against `target`, every conversation in its own
/// task; returns when the last turn of the last conversation has ended.
pub async fn run_round(
    client: &HttpClient,
    target: &Target,
    shape: Shape,
    round: usize,
) -> RoundSample {
    let system = system_prompt(round);
    let start = Instant::now();
    let mut tasks = Vec::new();
    for conversation in 0..shape.conversations {
        let (client, target, system) = (client.clone(), target.clone(), system.clone());
        tasks.push(tokio::spawn(async move {
            conversation_turns(&client, &target, shape, &system, conversation).await
        }));
    }
    let mut turns = Vec::new();
    for task in tasks {
        turns.extend(task.await.expect("a conversation's task panicked"));
    }
    RoundSample {
        wall: start.elapsed(),
        turns,
    }
}

/// One conversation, turn after turn, its history growing by the user's
/// message and the server's answer each turn.
async fn conversation_turns(
    client: &HttpClient,
    target: &Target,
    shape: Shape,
    system: &str,
    conversation: usize,
) -> Vec<TurnSample> {
    let mut messages: Vec<Value> = vec![json!({"role": "system", "content": system})];
    let mut samples = Vec::new();
    for turn in 0..shape.turns {
        messages.push(json!({"role": "user", "content": user_message(conversation, turn)}));
        let reply = chat_once(client, target, &messages, shape.max_tokens).await;
        messages.push(json!({"role": "assistant", "content": reply.text}));
        samples.push(TurnSample {
            conversation,
            turn,
            reply,
        });
    }
    samples
}
