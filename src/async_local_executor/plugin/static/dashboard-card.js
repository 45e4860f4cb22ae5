// The executor's health card on Airflow's home dashboard: a React plugin ("react_apps", destination
// "dashboard"). Airflow's UI imports this module and renders the component it leaves in
// globalThis.AirflowPlugin. It is plain JavaScript on the React and Chakra UI the host page exposes
// (globalThis.React, globalThis.ChakraUI), so it needs no build step and inherits the UI's theme,
// dark mode included.

const React = globalThis.React;
const Chakra = globalThis.ChakraUI || {};
const h = React.createElement;
const REFRESH_MS = 5000;
const PALETTE = { healthy: "green", unhealthy: "red", unknown: "gray" };

// Chakra's components where the host has them, plain elements where it does not.
const Box = Chakra.Box || "div";
const Text = Chakra.Text || "p";
const Heading = Chakra.Heading || "h3";
const Badge = Chakra.Badge || "span";
const Link = Chakra.Link || "a";

function url(path) {
  return new URL(path, document.baseURI).href;
}

function useHealth() {
  const [health, setHealth] = React.useState(null);
  React.useEffect(() => {
    let live = true;
    const load = () =>
      fetch(url("async-local-executor/health"), { cache: "no-store", credentials: "same-origin" })
        .then((response) => (response.ok ? response.json() : Promise.reject(new Error(`HTTP ${response.status}`))))
        .then((body) => live && setHealth(body))
        .catch((error) => live && setHealth({ status: "unknown", reason: `cannot reach the api-server: ${error.message}`, instances: [] }));
    load();
    const timer = setInterval(load, REFRESH_MS);
    return () => {
      live = false;
      clearInterval(timer);
    };
  }, []);
  return health;
}

function ExecutorHealthCard() {
  const health = useHealth();
  const status = health ? health.status : "unknown";
  const reasons = health ? (health.reason ? [health.reason] : health.instances.flatMap((i) => i.reasons)) : [];
  return h(
    Box,
    {
      "data-testid": "async-local-executor-card",
      borderWidth: "1px",
      borderRadius: "md",
      p: 4,
      mb: 4,
    },
    h(
      Heading,
      { size: "md", mb: 2 },
      "Executor ",
      h(Badge, { colorPalette: PALETTE[status] || "gray", "data-testid": "async-local-executor-card-verdict" }, status),
    ),
    ...reasons.map((reason) => h(Text, { key: reason, fontSize: "sm", color: "fg.muted" }, reason)),
    h(
      Text,
      { fontSize: "sm", mt: 1 },
      h(Link, { href: url("plugin/async-local-executor"), color: "fg.info" }, "AsyncLocalExecutor: slots, tasks and history"),
    ),
  );
}

globalThis.AirflowPlugin = ExecutorHealthCard;
