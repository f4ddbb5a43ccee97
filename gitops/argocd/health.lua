-- Argo CD health check for disagg.dev/DisaggregatedModel.
-- Install: the value of argocd-cm key resource.customizations.health.disagg.dev_DisaggregatedModel
-- (see gitops/argocd/kustomization.yaml and docs/gitops.md). Argo CD runs it with gopher-lua
-- (Lua 5.1): `obj` is the live object; the script returns {status = ..., message = ...}.
--
-- Reads only what the operator writes: status.observedGeneration and status.conditions
-- (Ready, Progressing, Degraded). Order: not yet observed -> Progressing; Degraded=True ->
-- Degraded; Ready=True -> Healthy; anything else -> Progressing with the operator's message.

local hs = {}

local function condition(conditions, kind)
  for _, c in ipairs(conditions) do
    if c.type == kind then
      return c
    end
  end
  return nil
end

local function describe(c, fallback)
  if c == nil then
    return fallback
  end
  local text = c.reason or ""
  if c.message ~= nil and c.message ~= "" then
    if text ~= "" then
      text = text .. ": " .. c.message
    else
      text = c.message
    end
  end
  if text == "" then
    return fallback
  end
  return text
end

local status = obj.status
if status == nil or status.conditions == nil then
  hs.status = "Progressing"
  hs.message = "Waiting for the disagg operator to report status"
  return hs
end

local generation = obj.metadata.generation
if generation ~= nil and (status.observedGeneration == nil or status.observedGeneration < generation) then
  hs.status = "Progressing"
  hs.message = "Waiting for the disagg operator to observe generation " .. tostring(generation)
  return hs
end

local degraded = condition(status.conditions, "Degraded")
if degraded ~= nil and degraded.status == "True" then
  hs.status = "Degraded"
  hs.message = describe(degraded, "Degraded")
  return hs
end

local ready = condition(status.conditions, "Ready")
if ready ~= nil and ready.status == "True" then
  hs.status = "Healthy"
  hs.message = describe(ready, "Ready")
  return hs
end

hs.status = "Progressing"
hs.message = describe(condition(status.conditions, "Progressing"), describe(ready, "Not ready yet"))
return hs
