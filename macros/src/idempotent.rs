//! `#[idempotent]`: arguments, checks and expansion.

use std::time::Duration;

use proc_macro2::TokenStream;
use quote::{quote, quote_spanned};
use syn::spanned::Spanned as _;
use syn::{Expr, Ident, LitStr};

use redguard_grammar::idempotency as grammar;

use crate::args::{Arguments, TemplateArg, arguments};
use crate::check;
use crate::errors::Errors;
use crate::expand;
use crate::guard::{Built, Context, Expansion, Guard};

pub(crate) struct Idempotent;

arguments! {
    /// `#[idempotent(key = "..", expire = .., scope = "..", payload = expr, timeout = "..",
    /// token = "..", scene = "..", detach, replicas = n, replicas_timeout = "..", wait = "..")]`
    IdempotentArgs for "idempotent" {
        key: Template,
        expire: Duration,
        scope: Str,
        payload: Expr,
        timeout: Duration,
        token: Template,
        scene: Str,
        detach: Flag,
        replicas: Int,
        replicas_timeout: Duration,
        wait: Duration,
    }
}

impl Guard for Idempotent {
    type Args = IdempotentArgs;

    /// Token mode (`token = ..`) may stand alone: the token is then the whole guard.
    fn requires_key(args: &IdempotentArgs) -> bool {
        !args.written("token")
    }

    fn check_signature(args: &IdempotentArgs, sig: &syn::Signature, errors: &mut Errors) {
        if args.detach.is_some() {
            check::owned_parameters("idempotent", "detach", sig, errors);
        }
    }

    fn check(args: IdempotentArgs, errors: &mut Errors) -> Option<Built> {
        let expire = args.expire.as_ref();
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
        if let Some(timeout) = &args.timeout
            && let Err(why) = grammar::timeout(timeout.value)
        {
            errors.push(timeout.span, format!("invalid `timeout`: {why}"));
        }
        if let Some(wait) = &args.wait {
            if let Err(why) = grammar::wait(wait.value) {
                errors.push(wait.span, format!("invalid `wait`: {why}"));
            } else if token_only {
                // Why: a duplicate waits for the record's outcome; token mode alone keeps none.
                errors.push(
                    wait.span,
                    "`wait` of `#[idempotent]` waits for the first execution's record, and \
                     token mode without `key` keeps none: add `key = \"..\"` or remove `wait`",
                );
            }
        }
        let token = match (&args.token, &args.scene) {
            (Some(token), Some(scene)) => {
                check::name("scene", scene, errors);
                Some((token.clone(), scene.clone()))
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
        if let Some(scope) = &args.scope {
            check::name("scope", scope, errors);
        }
        let replicas = check::replicas(
            "idempotent",
            args.replicas.as_ref(),
            args.replicas_timeout.as_ref(),
            errors,
        );
        if let (Some(count), true) = (&args.replicas, token_only) {
            // Why: the option confirms the record; token mode alone writes none, so it would
            // silently confirm nothing.
            errors.push(
                count.span,
                "`replicas` of `#[idempotent]` confirms the idempotency record, and token mode \
                 without `key` keeps none: add `key = \"..\"` or remove `replicas`",
            );
        }
        let expire = expire.map_or(Duration::from_secs(24 * 3600), |e| e.value);
        Some(Built::Wrapper(Box::new(IdempotentExpansion {
            key: args.key,
            expire,
            payload: args.payload,
            timeout: args.timeout.map(|t| t.value),
            token,
            scope: args.scope,
            detach: args.detach.is_some(),
            replicas,
            wait: args.wait.map(|w| w.value).filter(|w| !w.is_zero()),
        })))
    }
}

struct IdempotentExpansion {
    key: Option<TemplateArg>,
    expire: Duration,
    payload: Option<Expr>,
    timeout: Option<Duration>,
    token: Option<(TemplateArg, LitStr)>,
    scope: Option<LitStr>,
    detach: bool,
    replicas: Option<(u32, Duration)>,
    wait: Option<Duration>,
}

fn millis(duration: Duration) -> TokenStream {
    let ms = u64::try_from(duration.as_millis()).unwrap_or(u64::MAX);
    quote!(::core::time::Duration::from_millis(#ms))
}

impl Expansion for IdempotentExpansion {
    /// Output: `{ <return-type checks>; idempotency(scope, Some(key)).expire(..)
    /// [.payload(&expr)] [.timeout(..)] [.replicas(n, ..)] [.wait(..)] [token] }`, evaluated while the parameters are
    /// still borrowable.
    fn prelude(&self, cx: &Context) -> TokenStream {
        let (ret, krate) = (&cx.ret, &cx.krate);
        // `anyhow::Error` has `Classify` only with the feature: say so, not "derive it".
        let classified = if expand::names_anyhow(ret) {
            quote!(assert_anyhow_classified::<#ret>)
        } else {
            quote!(assert_classified::<#ret>)
        };
        let replayable = expand::at_return(cx, quote!(assert_replayable::<#ret>), quote!());
        let classified = expand::at_return(cx, classified, quote!());
        let checks = quote!(#replayable; #classified;);
        let scope = expand::scope(self.scope.as_ref(), cx);
        let key = match &self.key {
            Some(key) => {
                let key = expand::key(krate, key);
                quote!(::core::option::Option::Some(#key))
            }
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
        let replicas = expand::replicas(self.replicas);
        let wait = self.wait.map(|wait| {
            let wait = millis(wait);
            quote!(.wait(#wait))
        });
        let mut guard = quote! {
            #krate::__private::idempotency(#scope, #key)
                .expire(#expire)
                #(#payload)*
                #timeout
                #replicas
                #wait
        };
        if let Some((token, scene)) = &self.token {
            let token = expand::key(krate, token);
            guard = quote!(#krate::__private::idempotency_token(#guard, #scene, #token));
        }
        quote!({ #checks #guard })
    }

    /// Output: `__private::idempotent(binding, inner)`, or `idempotent_detached` with
    /// `detach`, spanned at the return type (see [`expand::at_return`]).
    fn wrap(&self, cx: &Context, binding: &Ident, inner: TokenStream) -> TokenStream {
        let run = if self.detach {
            quote!(idempotent_detached)
        } else {
            quote!(idempotent)
        };
        expand::at_return(cx, run, quote!(#binding, #inner))
    }
}
