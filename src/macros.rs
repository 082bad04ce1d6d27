//! [`durable_object!`](crate::durable_object): an agent's Durable Object class, with every
//! handler forwarded to its [`crate::AgentHost`], checked against `wrangler.toml` at compile
//! time.

/// Declares the Durable Object class of an agent: `durable_object!(Researcher)` exports a class
/// named `Researcher` whose instances each hold an [`AgentHost<Researcher>`](crate::AgentHost)
/// and forward `fetch`, WebSocket messages, closes and errors, and the alarm to it. It also
/// implements [`AgentClass`](crate::AgentClass) for the agent, so the class name is the
/// exported name and cannot drift from it.
///
/// At compile time it reads the crate's `wrangler.toml` and fails the build when the class has
/// no `[[durable_objects.bindings]]` entry (`name = "<binding>"`, `class_name = "<Class>"`) or is
/// missing from every `[[migrations]] new_sqlite_classes` (agents need SQLite storage):
///
/// ```text
/// durable_object!(Researcher);                                  // binding "Researcher", ./wrangler.toml
/// durable_object!(Researcher, binding = "RESEARCHER");          // another binding name
/// durable_object!(Researcher, config = "worker/wrangler.toml"); // another path, from Cargo.toml's directory
/// durable_object!(Researcher, unchecked);                       // no check (a wrangler.json config, say)
/// ```
///
/// A class the config does not declare does not build:
///
/// ```compile_fail,E0080
/// use agent_tools::prelude::*;
///
/// #[derive(Default)]
/// pub struct Ghost;
/// impl Agent for Ghost {}
///
/// // error[E0080]: evaluation panicked: wrangler.toml has no [[durable_objects.bindings]] entry
/// // with name = "Ghost" and class_name = "Ghost": add one, or pass `binding = "..."` to
/// // durable_object!
/// agent_tools::durable_object!(Ghost);
/// # fn main() {}
/// ```
///
/// A class name must be ASCII (its URL segment is its kebab-case, made with ASCII's case rules,
/// which are JavaScript's on ASCII); any other does not build:
///
/// ```compile_fail,E0080
/// use agent_tools::prelude::*;
///
/// #[derive(Default)]
/// pub struct Résumé;
/// impl Agent for Résumé {}
///
/// // error[E0080]: evaluation panicked: durable_object!: the class name `Résumé` must be ASCII
/// agent_tools::durable_object!(Résumé, unchecked);
/// # fn main() {}
/// ```
///
/// Without the check, a missing binding is a clear error on the first request instead. The
/// agent type must implement [`Agent`](crate::Agent) and `Default`, and the Worker crate must
/// depend on `worker` (the generated code uses `#[worker::durable_object]`).
#[macro_export]
macro_rules! durable_object {
    ($name:ident) => {
        $crate::durable_object!(@class $name, [::core::stringify!($name)]);
        $crate::durable_object!(@check $name, [::core::stringify!($name)], "wrangler.toml");
    };
    ($name:ident, binding = $binding:literal) => {
        $crate::durable_object!(@class $name, [$binding]);
        $crate::durable_object!(@check $name, [$binding], "wrangler.toml");
    };
    ($name:ident, config = $config:literal) => {
        $crate::durable_object!(@class $name, [::core::stringify!($name)]);
        $crate::durable_object!(@check $name, [::core::stringify!($name)], $config);
    };
    ($name:ident, binding = $binding:literal, config = $config:literal) => {
        $crate::durable_object!(@class $name, [$binding]);
        $crate::durable_object!(@check $name, [$binding], $config);
    };
    ($name:ident, unchecked) => {
        $crate::durable_object!(@class $name, [::core::stringify!($name)]);
    };
    ($name:ident, binding = $binding:literal, unchecked) => {
        $crate::durable_object!(@class $name, [$binding]);
    };
    (@check $name:ident, [$($binding:tt)*], $config:literal) => {
        const _: () = match $crate::__private::check_wrangler(
            ::core::include_str!(::core::concat!(::core::env!("CARGO_MANIFEST_DIR"), "/", $config)),
            ::core::stringify!($name),
            $($binding)*,
        ) {
            $crate::__private::WranglerCheck::Ok => {}
            $crate::__private::WranglerCheck::NoBinding => ::core::panic!(::core::concat!(
                $config,
                " has no [[durable_objects.bindings]] entry with name = \"",
                $($binding)*,
                "\" and class_name = \"",
                ::core::stringify!($name),
                "\": add one, or pass `binding = \"...\"` to durable_object!"
            )),
            $crate::__private::WranglerCheck::NotSqlite => ::core::panic!(::core::concat!(
                $config,
                " does not list \"",
                ::core::stringify!($name),
                "\" in a [[migrations]] new_sqlite_classes: agents need SQLite storage"
            )),
        };
    };
    (@class $name:ident, [$($binding:tt)*]) => {
        const _: () = ::core::assert!(
            ::core::primitive::str::is_ascii(::core::stringify!($name)),
            ::core::concat!("durable_object!: the class name `", ::core::stringify!($name), "` must be ASCII")
        );
        impl $crate::AgentClass for $name {
            const CLASS: &'static str = ::core::stringify!($name);
            const BINDING: &'static str = $($binding)*;
        }

        // The Durable Object class has the agent's name (that is the exported class name) and
        // lives in a block of its own, where `self::$name` still names the agent.
        const _: () = {
            // The generated bindings name `wasm_bindgen` as a path; the Worker need not depend on it.
            #[allow(unused_imports)]
            use ::worker::wasm_bindgen;

            #[::worker::durable_object]
            pub struct $name {
                host: $crate::AgentHost<self::$name>,
            }

            impl ::core::fmt::Debug for $name {
                fn fmt(&self, f: &mut ::core::fmt::Formatter<'_>) -> ::core::fmt::Result {
                    ::core::fmt::Debug::fmt(&self.host, f)
                }
            }

            impl ::worker::DurableObject for $name {
                fn new(state: ::worker::State, env: ::worker::Env) -> Self {
                    Self { host: $crate::AgentHost::new(state, env) }
                }

                async fn fetch(&self, req: ::worker::Request) -> ::worker::Result<::worker::Response> {
                    self.host.fetch(req).await
                }

                async fn alarm(&self) -> ::worker::Result<::worker::Response> {
                    self.host.alarm().await
                }

                async fn websocket_message(
                    &self,
                    ws: ::worker::WebSocket,
                    message: ::worker::WebSocketIncomingMessage,
                ) -> ::worker::Result<()> {
                    self.host.websocket_message(ws, message).await
                }

                async fn websocket_close(
                    &self,
                    ws: ::worker::WebSocket,
                    code: usize,
                    reason: ::std::string::String,
                    _was_clean: bool,
                ) -> ::worker::Result<()> {
                    self.host.websocket_close(ws, code, reason).await
                }

                async fn websocket_error(&self, ws: ::worker::WebSocket, _error: ::worker::Error) -> ::worker::Result<()> {
                    self.host.websocket_error(ws).await
                }
            }
        };
    };
}
