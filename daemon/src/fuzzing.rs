//! Entry points for the fuzz targets in `fuzz/fuzz_targets/` (cargo-fuzz,
//! nightly) and for the bounded stable run in this module's tests. Each
//! takes arbitrary bytes and checks properties; a panic is a finding, so
//! unlike the daemon's own code these assert freely.

use crate::config::{self, Config};

/// Config text: parsing never panics; every refusal names at least one
/// problem with a key path; an accepted config prints back to TOML that
/// parses to the same config.
pub fn config_text(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match config::parse(text) {
        Ok(config) => round_trip(&config),
        Err(problems) => {
            assert!(!problems.is_empty(), "refused without a problem: {text:?}");
            for p in &problems {
                assert!(
                    !p.to_string().trim().is_empty(),
                    "an empty problem for {text:?}"
                );
            }
        }
    }
}

fn round_trip(config: &Config) {
    let printed = match toml::to_string(config) {
        Ok(printed) => printed,
        Err(e) => panic!("an accepted config does not print as TOML: {e}\n{config:#?}"),
    };
    match config::parse(&printed) {
        Ok(again) => assert_eq!(
            &again, config,
            "printed config reads back differently:\n{printed}"
        ),
        Err(problems) => panic!("the printed config is refused: {problems:?}\n{printed}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A small deterministic generator (xorshift), so the bounded run is
    /// the same on every machine.
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }

        fn below(&mut self, n: usize) -> usize {
            (self.next() % n.max(1) as u64) as usize
        }
    }

    /// Bytes that matter to TOML and to our validation.
    const INTERESTING: &[&[u8]] = &[
        b"\"",
        b"'",
        b"[",
        b"]",
        b"[[",
        b"=",
        b"\n",
        b".",
        b",",
        b"{",
        b"}",
        b"#",
        b"0",
        b"-1",
        b"99999999999999999999",
        b"1e308",
        b"true",
        b"tp = 2",
        b"cards = [0, 0]",
        b"[models.x]\ntp = 1\ncards = [0]\ncheckpoint = \"/m\"\n",
        b"\\u0000",
        b"\xff",
        b"replicas = [[1], [2]]",
        b"0000:01:00.0",
    ];

    fn mutate(rng: &mut Rng, seed: &[u8]) -> Vec<u8> {
        let mut data = seed.to_vec();
        for _ in 0..=rng.below(4) {
            let at = rng.below(data.len() + 1);
            match rng.below(4) {
                0 => {
                    let piece = INTERESTING[rng.below(INTERESTING.len())];
                    data.splice(at..at, piece.iter().copied());
                }
                1 if !data.is_empty() => {
                    let end = (at + rng.below(16)).min(data.len());
                    data.drain(at.min(end)..end);
                }
                2 if at < data.len() => data[at] = rng.next() as u8,
                _ => data.truncate(at),
            }
        }
        data
    }

    fn seeds() -> Vec<Vec<u8>> {
        let mut seeds = vec![config::EXAMPLE_CONFIG.as_bytes().to_vec(), Vec::new()];
        let corpus =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus/config_parse");
        if let Ok(entries) = std::fs::read_dir(&corpus) {
            for entry in entries.flatten() {
                if let Ok(data) = std::fs::read(entry.path()) {
                    seeds.push(data);
                }
            }
        }
        seeds
    }

    #[test]
    fn the_example_and_the_corpus_hold_the_properties() {
        let seeds = seeds();
        assert!(seeds.len() > 3, "the checked-in corpus is missing");
        for seed in &seeds {
            config_text(seed);
        }
        let example = config::parse(config::EXAMPLE_CONFIG).expect("the example is valid");
        round_trip(&example);
    }

    /// The bounded stable run CI always does (the cargo-fuzz run needs a
    /// nightly toolchain): thousands of mutations of the seeds.
    #[test]
    fn mutated_configs_never_panic_and_round_trip_when_accepted() {
        let seeds = seeds();
        let mut rng = Rng(0x5eed_7e57_c0ff_ee11);
        for _ in 0..4000 {
            let seed = &seeds[rng.below(seeds.len())];
            config_text(&mutate(&mut rng, seed));
        }
    }
}
