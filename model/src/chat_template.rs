//! Rendering a chat conversation with the checkpoint's own Jinja template
//! (`tokenizer.chat_template`), the way the model was fine-tuned to read it.

use serde::Serialize;

/// ChatML, used when a checkpoint carries no template of its own.
const CHATML: &str = "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

/// Why a conversation could not be rendered.
#[derive(Debug, thiserror::Error)]
pub enum TemplateError {
    /// The template does not compile.
    #[error("the model's chat template does not parse: {0}")]
    Parse(String),
    /// Rendering failed (the template raised, or referenced something absent).
    #[error("cannot render the chat with the model's template: {0}")]
    Render(String),
}

/// One turn of a conversation.
#[derive(Debug, Clone, Serialize)]
pub struct Turn {
    /// `system`, `user` or `assistant`.
    pub role: String,
    /// The text.
    pub content: String,
}

/// A compiled chat template.
pub struct ChatTemplate {
    env: minijinja::Environment<'static>,
    bos_token: String,
    eos_token: String,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate").finish_non_exhaustive()
    }
}

impl ChatTemplate {
    /// Compiles `source` (or ChatML when `None`). `bos_token` and
    /// `eos_token` are the strings templates may reference.
    pub fn new(
        source: Option<&str>,
        bos_token: String,
        eos_token: String,
    ) -> Result<Self, TemplateError> {
        let mut env = minijinja::Environment::new();
        // Hugging Face templates call `raise_exception` to reject bad input.
        env.add_function(
            "raise_exception",
            |msg: String| -> Result<String, minijinja::Error> {
                Err(minijinja::Error::new(
                    minijinja::ErrorKind::InvalidOperation,
                    msg,
                ))
            },
        );
        env.add_template_owned("chat", source.unwrap_or(CHATML).to_string())
            .map_err(|e| TemplateError::Parse(e.to_string()))?;
        Ok(Self {
            env,
            bos_token,
            eos_token,
        })
    }

    /// The prompt text for `turns`, with the assistant's turn opened.
    pub fn render(&self, turns: &[Turn]) -> Result<String, TemplateError> {
        let tmpl = self
            .env
            .get_template("chat")
            .map_err(|e| TemplateError::Parse(e.to_string()))?;
        tmpl.render(minijinja::context! {
            messages => turns,
            add_generation_prompt => true,
            bos_token => &self.bos_token,
            eos_token => &self.eos_token,
        })
        .map_err(|e| TemplateError::Render(e.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SMOLLM2: &str = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

    #[test]
    fn smollm2_template_adds_default_system_turn_and_opens_assistant() {
        let t = ChatTemplate::new(Some(SMOLLM2), String::new(), "<|im_end|>".into()).unwrap();
        let out = t
            .render(&[Turn {
                role: "user".into(),
                content: "Hi".into(),
            }])
            .unwrap();
        assert_eq!(
            out,
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
        );
    }

    #[test]
    fn template_errors_are_reported_not_panicked() {
        let t = ChatTemplate::new(
            Some("{{ raise_exception('roles must alternate') }}"),
            String::new(),
            String::new(),
        )
        .unwrap();
        let err = t.render(&[]).unwrap_err().to_string();
        assert!(err.contains("roles must alternate"), "{err}");
        assert!(ChatTemplate::new(Some("{% for %}"), String::new(), String::new()).is_err());
    }
}
