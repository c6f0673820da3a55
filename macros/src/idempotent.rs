//! `#[idempotent]`: arguments, checks and expansion.

use std::time::Duration;

use proc_macro2::TokenStream;
use quote::{quote, quote_spanned};
use syn::spanned::Spanned as _;
use syn::{Expr, Ident, ItemFn, LitStr};

use redguard_grammar::idempotency as grammar;

use crate::args::{ArgSpec, Args, Kind};
use crate::check;
use crate::errors::Errors;
use crate::expand;
use crate::guard::{Context, Expansion, Guard, arg};

pub(crate) struct Idempotent;

impl Guard for Idempotent {
    const NAME: &'static str = "idempotent";
    const ARGS: &'static [ArgSpec] = &[
        arg("key", Kind::Template),
        arg("expire", Kind::Duration),
        arg("scope", Kind::Str),
        arg("payload", Kind::Expr),
        arg("timeout", Kind::Duration),
        arg("token", Kind::Template),
        arg("scene", Kind::Str),
        arg("detach", Kind::Flag),
    ];

    /// Token mode (`token = ..`) may stand alone: the token is then the whole guard.
    fn requires_key(args: &Args) -> bool {
        !args.written("token")
    }

    fn check(args: Args, _item: &ItemFn, errors: &mut Errors) -> Option<Box<dyn Expansion>> {
        let key = args.template("key").map(expand::key);
        let expire = args.duration("expire");
        let token_only = args.written("token") && !args.written("key");
        if !args.written("expire") && !token_only {
            errors.push(
                proc_macro2::Span::call_site(),
                "`#[idempotent]` needs `expire = <seconds or \"10m\">`: how long the record \
                 lives (at most 7 days)",
            );
        }
        if let Some(expire) = expire
            && let Err(why) = grammar::expire(expire.value)
        {
            errors.push(expire.span, format!("invalid `expire`: {why}"));
        }
        if let Some(timeout) = args.duration("timeout")
            && let Err(why) = grammar::timeout(timeout.value)
        {
            errors.push(timeout.span, format!("invalid `timeout`: {why}"));
        }
        let token = match (args.template("token"), args.str("scene")) {
            (Some(token), Some(scene)) => {
                check::name("scene", scene, errors);
                Some((token, scene.clone()))
            }
            (Some(token), None) => {
                errors.push(
                    token.lit.span(),
                    "token mode needs `scene = \"...\"`: the operation the token was issued for",
                );
                None
            }
            (None, Some(scene)) if !args.written("token") => {
                errors.push(
                    scene.span(),
                    "`scene` only applies with `token = \"{...}\"`",
                );
                None
            }
            _ => None,
        };
        if let Some(scope) = args.str("scope") {
            check::name("scope", scope, errors);
        }
        Some(Box::new(IdempotentExpansion {
            key,
            expire: expire.map_or(Duration::from_secs(24 * 3600), |e| e.value),
            payload: args.expr("payload").cloned(),
            timeout: args.duration("timeout").map(|t| t.value),
            token: token.map(|(token, scene)| (expand::key(token), scene)),
            scope: args.str("scope").cloned(),
            detach: args.flag("detach").is_some(),
        }))
    }
}

struct IdempotentExpansion {
    key: Option<TokenStream>,
    expire: Duration,
    payload: Option<Expr>,
    timeout: Option<Duration>,
    token: Option<(TokenStream, LitStr)>,
    scope: Option<LitStr>,
    detach: bool,
}

fn millis(duration: Duration) -> TokenStream {
    let ms = u64::try_from(duration.as_millis()).unwrap_or(u64::MAX);
    quote!(::core::time::Duration::from_millis(#ms))
}

impl Expansion for IdempotentExpansion {
    /// Output: `{ <return-type checks>; idempotency(scope, Some(key)).expire(..)
    /// [.payload(&expr)] [.timeout(..)] [token] }`, evaluated while the parameters are
    /// still borrowable.
    fn prelude(&self, cx: &Context) -> TokenStream {
        let ret = &cx.ret;
        let checks = quote_spanned!(ret.span()=>
            ::redguard::__private::assert_replayable::<#ret>();
            ::redguard::__private::assert_classified::<#ret>();
        );
        let scope = expand::scope(self.scope.as_ref(), cx);
        let key = match &self.key {
            Some(key) => quote!(::core::option::Option::Some(#key)),
            None => quote!(::core::option::Option::None),
        };
        let expire = millis(self.expire);
        let payload = self
            .payload
            .iter()
            .map(|payload| quote_spanned!(payload.span()=> .payload(&(#payload))));
        let timeout = self.timeout.map(|timeout| {
            let timeout = millis(timeout);
            quote!(.timeout(#timeout))
        });
        let mut guard = quote! {
            ::redguard::__private::idempotency(#scope, #key)
                .expire(#expire)
                #(#payload)*
                #timeout
        };
        if let Some((token, scene)) = &self.token {
            guard = quote!(::redguard::__private::idempotency_token(#guard, #scene, #token));
        }
        quote!({ #checks #guard })
    }

    /// Output: `binding.run(inner)`, or `binding.detach().run(inner)` with `detach`.
    fn wrap(&self, _cx: &Context, binding: &Ident, inner: TokenStream) -> TokenStream {
        if self.detach {
            quote!(#binding.detach().run(#inner))
        } else {
            quote!(#binding.run(#inner))
        }
    }
}
