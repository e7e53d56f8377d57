//! The accuracy gate's pass mark, read the same way by the daemon's config
//! (`[models.X.accuracy.TASK] pass_mark`) and by `ttctl eval --pass-mark`.

/// `(N, M)` of a pass mark written `N/M` (at least N correct of exactly M
/// samples), with M above 0 and N at most M; None for anything else.
pub fn pass_mark(text: &str) -> Option<(u32, u32)> {
    let (n, m) = text.split_once('/')?;
    let (n, m) = (n.trim().parse::<u32>().ok()?, m.trim().parse::<u32>().ok()?);
    (m > 0 && n <= m).then_some((n, m))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pass_mark_is_n_of_m() {
        assert_eq!(pass_mark("55/60"), Some((55, 60)));
        assert_eq!(pass_mark(" 0 / 1 "), Some((0, 1)));
        for bad in ["61/60", "5/0", "55", "a/60", "-1/60", ""] {
            assert_eq!(pass_mark(bad), None, "{bad}");
        }
    }
}
