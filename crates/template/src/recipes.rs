//! The named templates' recipes, as data.
//!
//! A recipe is everything that decides a template's contents: the Debian
//! suite and variant, the packages, and the shell run in the finished
//! root (mmdebstrap's `--customize-hook`, with the root's path as `$1`).
//! [`Recipe::text`] renders all of it; its SHA-256 is the stamp a built
//! template is checked against, so changing anything here rebuilds that
//! template on its next use. The mirror is not part of the recipe (it
//! decides where packages come from, not what they are).

/// How a named template is made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Recipe {
    /// `[a-z0-9][a-z0-9._-]*`, as `brig_core::TemplateRef::Named` accepts.
    pub name: &'static str,
    /// One line, for `brig template ls`.
    pub description: &'static str,
    /// Bump when the way the template is made changes in a way the fields
    /// below do not capture.
    pub version: u32,
    pub suite: &'static str,
    pub variant: &'static str,
    /// Install the packages' Recommends too (apt's default). Off: they
    /// pulled in 1 GiB of compilers' friends (boost, scipy, sympy) that
    /// nobody asked for; what is wanted is listed explicitly instead.
    pub recommends: bool,
    /// Package groups on top of the variant (`mmdebstrap --include`).
    pub packages: &'static [&'static [&'static str]],
    /// Groups of shell commands run on the finished root, in order, `$1`
    /// being its path.
    pub customize: &'static [&'static [&'static str]],
}

/// What every template has: a usable Debian userland for agents' code.
const BASE_PACKAGES: &[&str] = &[
    "bash",
    "coreutils",
    "procps",
    "psmisc",
    "less",
    "file",
    "findutils",
    "grep",
    "sed",
    "gawk",
    "tar",
    "gzip",
    "xz-utils",
    "bzip2",
    "zip",
    "unzip",
    "ca-certificates",
    "curl",
    "wget",
    "git",
    "openssh-client",
    "iproute2",
    "sudo",
    // Resolves the sandbox's hostname (its id) without an /etc/hosts entry:
    // sudo otherwise prints "unable to resolve host" on every call.
    "libnss-myhostname",
    "locales",
    "tzdata",
    "python3",
    "python3-pip",
    "python3-venv",
    // What `pip install` and `npm install` need to build native code.
    "python3-dev",
    "build-essential",
    "nodejs",
    "npm",
];

/// The code interpreter's Python side: Jupyter kernels and the data stack
/// E2B's `run_code` users expect.
const CODE_INTERPRETER_PACKAGES: &[&str] = &[
    "python3-ipykernel",
    "python3-jupyter-client",
    "python3-pexpect",
    "python3-numpy",
    "python3-pandas",
    "python3-matplotlib",
];

/// What the in-sandbox code-interpreter server
/// (crates/e2b/resources/code-interpreter/) needs on top of the above.
/// Add its packages here; the template rebuilds on next use.
const CODE_INTERPRETER_SERVER_PACKAGES: &[&str] = &[
    // bash_kernel's dependencies (the kernel itself is below, from PyPI).
    "python3-pexpect",
    "python3-filetype",
];

/// The bash Jupyter kernel: one pure-Python wheel, not packaged by Debian;
/// its dependencies are the Debian packages above (`--no-deps`).
/// pip runs in the new root but must trust what the host trusts (a host
/// behind a TLS-inspecting proxy has that proxy's CA only in its own
/// bundle): the root's bundle is swapped for the host's during the install
/// and put back after, so the template keeps Debian's own.
///
/// The JavaScript kernel is Deno's (`deno jupyter`): the runtime from npm
/// (`deno`, whose platform package carries the binary), installed the same
/// way with npm, and a system-wide kernelspec named `deno` that runs it
/// without colours (the code interpreter's text results are plain).
const CODE_INTERPRETER_SETUP: &[&str] = &[
    r#"b="$1/etc/ssl/certs/ca-certificates.crt"; cp "$b" "$b.debian" && cp "${SSL_CERT_FILE:-/etc/ssl/certs/ca-certificates.crt}" "$b" && chroot "$1" env PIP_FIND_LINKS= pip install --quiet --no-deps --no-cache-dir --break-system-packages bash_kernel==0.10.0; rc=$?; mv "$b.debian" "$b"; exit $rc"#,
    r#"b="$1/etc/ssl/certs/ca-certificates.crt"; cp "$b" "$b.debian" && cp "${SSL_CERT_FILE:-/etc/ssl/certs/ca-certificates.crt}" "$b" && chroot "$1" env NODE_EXTRA_CA_CERTS=/etc/ssl/certs/ca-certificates.crt npm install --global --silent --no-audit --no-fund --no-update-notifier deno@2.9.6; rc=$?; mv "$b.debian" "$b"; rm -rf "$1/root/.npm"; exit $rc"#,
    r#"ln -sf /usr/local/lib/node_modules/deno/deno "$1/usr/local/bin/deno" && "$1/usr/local/lib/node_modules/deno/deno" --version >/dev/null"#,
    r#"mkdir -p "$1/usr/local/share/jupyter/kernels/deno" && printf '%s\n' '{"argv": ["/usr/local/bin/deno", "jupyter", "--kernel", "--conn", "{connection_file}"], "display_name": "Deno", "language": "typescript", "env": {"NO_COLOR": "1"}}' > "$1/usr/local/share/jupyter/kernels/deno/kernel.json""#,
];

/// User `user` (uid/gid 1000, /home/user, bash) with passwordless sudo, as
/// E2B sandboxes have; a UTF-8 locale by default.
const USER_SETUP: &[&str] = &[
    r#"chroot "$1" useradd --create-home --uid 1000 --user-group --shell /bin/bash user"#,
    r#"printf 'user ALL=(ALL:ALL) NOPASSWD: ALL\n' > "$1/etc/sudoers.d/user""#,
    r#"chmod 0440 "$1/etc/sudoers.d/user""#,
    r#"printf 'LANG=C.UTF-8\n' > "$1/etc/default/locale""#,
    r#"chown -R 1000:1000 "$1/home/user""#,
    // E2B's clients run every command as `bash -l -c CMD`, and Debian's
    // /etc/profile asks `$(id -u)` (a process: 1-1.5 ms here, a third of a
    // command's cost). Bash knows its EUID; sh still runs `id -u`.
    r#"sed -i 's/"$(id -u)"/"${EUID:-$(id -u)}"/' "$1/etc/profile" && grep -q 'EUID:-' "$1/etc/profile""#,
    // No machine-specific state: the sandbox's hostname is its id.
    r#"rm -f "$1/etc/hostname" "$1/etc/machine-id" && touch "$1/etc/machine-id""#,
];

pub const BASE: Recipe = Recipe {
    name: "base",
    description: "Debian bookworm: python3, pip, nodejs, npm, git, curl, gcc, sudo; user `user`",
    version: 1,
    suite: "bookworm",
    variant: "minbase",
    recommends: false,
    packages: &[BASE_PACKAGES],
    customize: &[USER_SETUP],
};

pub const CODE_INTERPRETER_V1: Recipe = Recipe {
    name: "code-interpreter-v1",
    description: "base + ipykernel, jupyter-client, numpy, pandas, matplotlib; bash and Deno (JavaScript/TypeScript) kernels",
    version: 1,
    suite: "bookworm",
    variant: "minbase",
    recommends: false,
    packages: &[
        BASE_PACKAGES,
        CODE_INTERPRETER_PACKAGES,
        CODE_INTERPRETER_SERVER_PACKAGES,
    ],
    customize: &[USER_SETUP, CODE_INTERPRETER_SETUP],
};

/// Every named template, in `brig template ls` order.
pub const ALL: &[Recipe] = &[BASE, CODE_INTERPRETER_V1];

impl Recipe {
    /// The packages, in order, without duplicates.
    pub fn package_list(&self) -> Vec<&'static str> {
        let mut out: Vec<&'static str> = Vec::new();
        for p in self.packages.iter().flat_map(|g| g.iter()) {
            if !out.contains(p) {
                out.push(p);
            }
        }
        out
    }

    /// Everything that decides the template's contents, one field a line.
    pub fn text(&self) -> String {
        let mut s = format!(
            "recipe_version={}\nsuite={}\nvariant={}\nrecommends={}\ninclude={}\n",
            self.version,
            self.suite,
            self.variant,
            self.recommends,
            self.package_list().join(",")
        );
        for c in self.customize.iter().flat_map(|g| g.iter()) {
            s.push_str("customize=");
            s.push_str(c);
            s.push('\n');
        }
        s
    }
}
